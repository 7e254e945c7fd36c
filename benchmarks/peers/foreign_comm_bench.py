#!/usr/bin/env python3
"""The engine's host collectives over torch.distributed's gloo (strata_comm_create_foreign, strata._torch_comm,
docs/decisions/0033) and over shared memory (strata_comm_create_shm set up over that gloo communicator, as under
torchrun; decision 0053) against the MPI back-end, in one run: three engines of the same ZeRO-3 model in each rank,
one on each transport, stepped in turns, with no compute between the hooks, so a step is the engine's all-gathers
(forward and backward), reduce-scatters and its optimizer update. Beside them, the floors of the transports
themselves on one unit's buffers: gloo's all_gather_into_tensor and reduce_scatter_tensor, the reduce-scatter
strata._torch_comm's callback makes of gloo (all_to_all_single, then the sum in the MPI back-end's order),
mpi4py's Allgather and Reduce_scatter_block (blocking MPI), and a memcpy of the unit on every rank at once (the
least a shared-memory all-gather moves per rank).

    scripts/mpirun_local -n 2 build/venv/bin/python benchmarks/peers/foreign_comm_bench.py --units 4 \\
        --unit-mib 32 --steps 5 --repeat 3

torch.distributed is initialised from MPI's ranks over a file store (no port is chosen: gloo binds its own). Per
transport and repetition: the median step's wall time, the engine's exposed communication time of that step
(strata_stats.last_exposed_comm_ms), and the payload moved per step (Note [Traffic]: the gathered parameters
twice and the reduced gradients once, fp32) over that time.
"""
import argparse
import ctypes
import json
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

from strata import _capi, _torch_comm

lib = _capi.lib


def engine_on(comm, a):
    cfg = {"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "strata": {"optimizer_threads": 1, "collective_timeout_ms": 600000, "max_live_units": 3}}
    e = ctypes.c_void_p()
    _capi.check(lib.strata_engine_create(comm, _capi.EngineOptions.new(config_json=json.dumps(cfg).encode()),
                                         ctypes.byref(e)))
    n = int(a.unit_mib * 2**20) // 4
    shape = (ctypes.c_int64 * 1)(n)
    for u in range(a.units):
        spec = (_capi.ParamSpec * 1)(_capi.ParamSpec.new(name=b"w", shape=shape, ndim=1, init=4, init_value=0.1))
        _capi.check(lib.strata_engine_register_unit(e, f"u{u}".encode(), spec, 1, None))
    _capi.check(lib.strata_engine_finalize(e))
    return e


def step(e, a):
    """One step: every unit forward, then backward in reverse (a gradient of 1e-3 added), then the update."""
    _capi.check(lib.strata_engine_begin_micro_batch(e))
    for u in range(a.units):
        _capi.check(lib.strata_engine_begin_forward(e, u, None))
        _capi.check(lib.strata_engine_end_forward(e, u))
    n = int(a.unit_mib * 2**20) // 4
    for u in reversed(range(a.units)):
        b = _capi.UnitBuffers.new()
        _capi.check(lib.strata_engine_begin_backward(e, u, b))
        _torch_comm.view(ctypes.cast(b.grads[0], ctypes.c_void_p).value, n, _capi.DTYPE_F32).add_(1e-3)
        _capi.check(lib.strata_engine_end_backward(e, u))
    _capi.check(lib.strata_engine_end_micro_batch(e))
    _capi.check(lib.strata_engine_step(e, None))
    s = _capi.Stats.new()
    _capi.check(lib.strata_engine_get_stats(e, s))
    return s.last_step_ms, s.last_exposed_comm_ms


def floors(a, world):
    """Seconds of one unit's all-gather and reduce-scatter, gloo and blocking MPI (best of 3)."""
    n = int(a.unit_mib * 2**20) // 4
    out = {}
    send, full, copy = torch.ones(n // world.Get_size()), torch.empty(n), torch.empty(n)
    ep = _torch_comm.Endpoint(dist.group.WORLD, None, owned=False)  # what Strata's callbacks run
    for name, fn in (("gloo all_gather", lambda: dist.all_gather_into_tensor(full, send)),
                     ("gloo reduce_scatter", lambda: dist.reduce_scatter_tensor(send, full)),
                     ("callback reduce_scatter (all_to_all, sum in MPI's order)",
                      lambda: ep.reduce_scatter(full.data_ptr(), send.data_ptr(), send.numel(), _capi.DTYPE_F32)),
                     ("mpi all_gather", lambda: world.Allgather(send.numpy(), full.numpy())),
                     ("mpi reduce_scatter", lambda: world.Reduce_scatter_block(full.numpy(), send.numpy())),
                     ("memcpy of the unit, every rank at once", lambda: (copy.copy_(full), world.Barrier()))):
        times = []
        for _ in range(3):
            world.Barrier()
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = min(times)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--unit-mib", type=float, default=32, help="fp32 parameters per unit, MiB (0.004: 4 KiB, to time "
                   "small collectives)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    path = world.bcast(tempfile.mktemp(prefix="strata-bench-store-") if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=size)
    mpi_comm = ctypes.c_void_p()
    _capi.check(lib.strata_comm_create_mpi(world.py2f(), ctypes.byref(mpi_comm)))
    gloo_comm = _torch_comm.create(dist.group.WORLD, dist.distributed_c10d._get_default_store(), 600000, "gloo")
    shm_comm = ctypes.c_void_p()
    _capi.check(lib.strata_comm_create_shm(gloo_comm, 600000, ctypes.byref(shm_comm)))
    engines = {"mpi": engine_on(mpi_comm, a), "gloo": engine_on(gloo_comm, a), "shm": engine_on(shm_comm, a)}
    payload = 3 * a.units * int(a.unit_mib * 2**20)  # bytes per step (Note [Traffic])
    rows = []
    for rep in range(a.repeat):
        for name, e in engines.items():
            step(e, a)  # warm-up
            world.Barrier()
            runs = [step(e, a) for _ in range(a.steps)]
            wall = statistics.median(r[0] for r in runs)
            comm = statistics.median(r[1] for r in runs)
            rows.append({"transport": name, "repeat": rep, "step_ms": round(wall, 1), "exposed_comm_ms": round(comm, 1),
                         "payload_gb_per_s": round(payload / (comm / 1e3) / 1e9, 3)})
    fl = floors(a, world)
    for e in engines.values():
        _capi.check(lib.strata_engine_destroy(e))
    _capi.check(lib.strata_comm_destroy(mpi_comm))
    _capi.check(lib.strata_comm_destroy(gloo_comm))
    _capi.check(lib.strata_comm_destroy(shm_comm))
    if rank == 0:
        print(f"{size} ranks, {a.units} units of {a.unit_mib} MiB (fp32), payload {payload / 2**20:.0f} MiB per step")
        for r in rows:
            print(json.dumps(r))
        unit = int(a.unit_mib * 2**20)
        for k, v in fl.items():
            print(json.dumps({"floor": k, "ms": round(v * 1e3, 1), "payload_gb_per_s": round(unit / v / 1e9, 3)}))
    dist.destroy_process_group()  # the file store removes its file


if __name__ == "__main__":
    main()
