"""Run by tests/python/run.sh at 2 ranks: rank 0's script raises (or, with the argument `exit`, calls
sys.exit after a backward pass, in the middle of a step) while rank 1 goes on into a collective. strata's
excepthook (or its exit handler) aborts the job right away, so rank 1 does not wait for
strata.collective_timeout_ms (set to 10 minutes here, beyond run.sh's limit of this run)."""
import sys

import torch

import strata.torch as st
from models import batches, tiny_lm

torch.set_num_threads(1)
model = tiny_lm()
engine = st.shard(model, {"strata": {"optimizer_threads": 1, "collective_timeout_ms": 600000}})
exit_mid_step = sys.argv[1:] == ["exit"]
if st.rank() == 0 and not exit_mid_step:
    raise ValueError("rank 0 fails on purpose")
x, y = batches(0, 0, st.rank())
model(x, y).backward()  # stage 3: rank 1 waits in the first gather for rank 0
if st.rank() == 0:
    sys.exit(3)  # leaves before the step, in which rank 1 waits for it
engine.step()
