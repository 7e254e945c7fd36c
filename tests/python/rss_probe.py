"""Run by test_created.py under its own `mpirun -n 2`: st.shard() of a model of 32 blocks of 8 MiB (256 MiB of
fp32 parameters), created from a factory (argv[1] "created") or built first ("built"), at stage 3 with the
parameters and optimizer state on NVMe under argv[2] (so the engine's host memory is small beside the model).
Each rank writes argv[2]/rss-RANK.json: the bytes its peak RSS rose by over its RSS before the model was made, the
engine's own host bytes (its accounting, peaks), the model's and the largest unit's bytes; a created model is
then exported twice (engine.save_pretrained into argv[2]/export, files of 64 MB), and the bytes the peak
rose by over the RSS before each export (the peak reset first: /proc/self/clear_refs) are
first_export_added_bytes and second_export_added_bytes. The first gathers touch the pages of the engine's own
NVMe cache buffers for the first time (bytes its accounting already counts); the second shows the export's."""
import json
import resource
import sys

import torch

import strata.torch as st


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, d)
        self.fc2 = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Blocks(torch.nn.Module):
    def __init__(self, d=1024, n=32):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.head = torch.nn.Linear(d, 8)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


def status_bytes(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024


def vm_rss_bytes():
    return status_bytes("VmRSS")


mode, nvme = sys.argv[1], sys.argv[2]
cfg = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                             "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
       "strata": {"optimizer_threads": 1, "collective_timeout_ms": 300000}}
torch.manual_seed(0)
before = vm_rss_bytes()
engine = st.shard(Blocks, cfg) if mode == "created" else st.shard(Blocks(), cfg)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
s = engine.stats()
sizes = [4 * sum(u.layout.numels) for u in engine.units]
figures = {"added_bytes": peak - before, "model_bytes": sum(sizes), "unit_bytes": max(sizes),
           "engine_host_bytes": s["device_peak_bytes"] + s["pinned_host_peak_bytes"]}
if mode == "created":
    for run in ("first", "second"):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = vm_rss_bytes()
        engine.save_pretrained(f"{nvme}/export", max_shard_size="64MB")
        figures[f"{run}_export_added_bytes"] = status_bytes("VmHWM") - before
with open(f"{nvme}/rss-{st.rank()}.json", "w") as f:  # a file per rank: the ranks' stdout lines can interleave
    json.dump(figures, f)
engine.close()
