#!/usr/bin/env python3
"""The latency of a small collective, the cost the strata.torch tests' tiny models are made of (docs/decisions/
0049-fewer-front-end-collectives.md), under mpirun (the MPI back-end) or torchrun (gloo through the foreign
communicator, strata._torch_comm):

    scripts/mpirun_local -n 4 build/venv/bin/python benchmarks/peers/small_collectives.py
    PYTHONPATH=tests/python/no_mpi4py build/venv/bin/python -m torch.distributed.run --standalone \\
        --nproc-per-node 4 benchmarks/peers/small_collectives.py

Rank 0 prints, per call (median and mean over --calls): the engine's gather_unit of one block of the tests' tiny
model (one all-gather through the engine's communicator), a training step of that model (wall and the process's
CPU time), and under torchrun the same all-gather three ways: torch's own all_gather_into_tensor on a gloo group,
strata._torch_comm's callback body called from the script's thread (no Strata thread in between), and through the
engine (Strata's waiting thread hands it to the communicator's caller thread, Note [Foreign calls]).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata.torch as st  # noqa: E402
from common import config  # noqa: E402  (the tests' configuration and model)
from models import batches, tiny_lm  # noqa: E402
from strata import _capi, _comm, _torch_comm  # noqa: E402


def timed(fn, n):
    ts, cpu = [], time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, statistics.mean(ts) * 1e3, (time.process_time() - cpu) / n * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = tiny_lm()
    engine = st.shard(model, config(3))
    rank, world = st.rank(), st.world_size()

    def step():
        x, y = batches(0, 0, rank)
        model(x, y).backward()
        engine.step()

    rows = {}
    if _comm.bind().kind == "torch":
        g = dist.split_group(dist.group.WORLD, [list(range(world))])
        per = -(-engine.units[1].layout.total // world)
        src, out = torch.zeros(per), torch.empty(per * world)
        ep = _torch_comm.Endpoint(g, None, owned=False)
        rows["gloo all_gather_into_tensor"] = timed(lambda: dist.all_gather_into_tensor(out, src, group=g), a.calls)
        rows["the callback's body, script's thread"] = timed(
            lambda: ep.all_gather(src.data_ptr(), out.data_ptr(), per, _capi.DTYPE_F32), a.calls)
    rows["engine gather_unit (one all-gather)"] = timed(lambda: engine.gather_unit(1), a.calls)
    rows["training step"] = timed(step, a.steps)
    engine.close()
    if rank == 0:
        print(f"{_comm.bind().kind}, {world} ranks, block of {engine.units[1].layout.total} fp32")
        for k, (med, mean, cpu) in rows.items():
            print(f"  {k:40s} median {med:7.2f} ms  mean {mean:7.2f} ms  CPU {cpu:6.2f} ms per call")


if __name__ == "__main__":
    main()
