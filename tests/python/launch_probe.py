"""Run by test_launch.py under `torchrun --nproc-per-node 2` on a host without a GPU. argv[1]:
  cuda  st.shard(..., device="cuda"): strata_comm_create_torchrun's bootstrap exchange runs for real, then
        every rank fails naming the missing GPU and the id the ranks exchanged.
Each rank prints its failure, then meets the others (gloo) before exiting, since torchrun stops the other
ranks at the first exit and would cut their output short."""
import sys

import torch

import strata.torch as st

print(f"imported: rank {st.rank()} of {st.world_size()}, mean rank {st.all_reduce_mean(st.rank())}", flush=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
try:
    st.shard(model, config={"strata": {"collective_timeout_ms": 900000}},
             device="cuda" if sys.argv[1] == "cuda" else None)
except Exception as e:  # noqa: BLE001 (printed and re-raised as an exit status)
    print(f"rank {st.rank()} failed: {type(e).__name__}: {e}", flush=True)
    st.all_reduce_mean(0.0)
    sys.exit(3)
print("sharded", flush=True)
