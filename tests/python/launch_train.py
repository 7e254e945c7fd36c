"""Run by test_launch.py under `mpirun -n N` and under `torchrun --standalone --nproc-per-node N`: trains a host
model for a few steps and saves, per rank, the losses, the step results and the final full state to
argv[1]/rank<r>.pt. argv[2]: the ZeRO stage; argv[3] (optional): "raise" makes rank 1 raise in step 2, "stall"
makes it sleep there for 10 minutes before its backward (with a collective timeout of 4 s), "kill" makes it
kill itself (SIGKILL) there, printing the time. LAUNCH_SHARD_GROUP in
the environment, when set, is zero_optimization.shard_group_size ("node" or an integer); LAUNCH_MESH="RxS" shards
over a 2-D DeviceMesh of R replicas of S shards instead (st.shard's device_mesh); LAUNCH_NVME=1 keeps the
optimizer state on NVMe under argv[1].

Two units of 1024 x 1024 + 1024 parameters, whose reduce-scatter blocks at 4 ranks are just over 1 MiB (summed
in rank order by the MPI back-end's direct exchange), and a small head (summed pairwise by MPI's collective):
both of the MPI back-end's orders of a sum, which strata._torch_comm follows."""
import ctypes
import os
import signal
import sys
import time

import torch

import strata.torch as st
from strata import _capi, _torch_comm

out_dir, stage = sys.argv[1], int(sys.argv[2])
fault = sys.argv[3] if len(sys.argv) > 3 else None
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024),
                            torch.nn.Tanh(), torch.nn.Linear(1024, 8))
config = {"zero_optimization": {"stage": stage}, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
          "strata": {"collective_timeout_ms": 4000 if fault == "stall" else 900000, "optimizer_threads": 1}}
if os.environ.get("LAUNCH_NVME"):  # the optimizer state on NVMe under out_dir (its I/O queue logs at Info)
    os.makedirs(os.path.join(out_dir, "nvme"), exist_ok=True)
    config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": os.path.join(out_dir, "nvme")}
group = os.environ.get("LAUNCH_SHARD_GROUP")
if group:
    config["zero_optimization"]["shard_group_size"] = group if group == "node" else int(group)
kwargs = {}
if os.environ.get("LAUNCH_MESH"):
    from torch.distributed.device_mesh import init_device_mesh
    shape = tuple(int(n) for n in os.environ["LAUNCH_MESH"].split("x"))
    kwargs["device_mesh"] = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
engine = st.shard(model, config=config, unit_classes=[torch.nn.Linear], **kwargs)
print(f"rank {st.rank()} of {st.world_size()}: sharded (host transport {_torch_comm.transport or 'mpi'})", flush=True)
losses, results = [], []
for step in range(3):
    for m in range(2):
        g = torch.Generator().manual_seed(1000 * step + 10 * m + st.rank())
        x, y = torch.randn(16, 1024, generator=g), torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if fault == "stall" and step == 2 and st.rank() == 1:
            time.sleep(600)
        loss.backward()
        losses.append(loss.item())
        if fault == "raise" and step == 2 and st.rank() == 1:
            raise RuntimeError("planted failure of rank 1 in step 2")
        if fault == "kill" and step == 2 and st.rank() == 1:
            print(f"rank 1: killing itself in step 2 at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    results.append(engine.step())
state = engine.full_state_dict()
held = []  # each unit's elements this rank keeps: its shard group's part (strata_engine_held_range)
for unit in range(len(engine.units)):
    begin, end = ctypes.c_uint64(), ctypes.c_uint64()
    _capi.check(_capi.lib.strata_engine_held_range(engine.handle, unit, ctypes.byref(begin), ctypes.byref(end)))
    held.append((begin.value, end.value))
os.makedirs(out_dir, exist_ok=True)
torch.save({"losses": losses, "results": results, "state": state, "world": st.world_size(), "held": held,
            "mean_loss": st.all_reduce_mean(losses[-1])}, os.path.join(out_dir, f"rank{st.rank()}.pt"))
print(f"rank {st.rank()}: saved", flush=True)
