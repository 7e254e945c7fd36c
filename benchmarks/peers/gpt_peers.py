#!/usr/bin/env python3
"""Strata's ZeRO-3 GPT training step against PyTorch DDP and FSDP2 on CPU (gloo), measured in one run.

Same model shape (GPT-2 architecture, fp32), same per-rank micro-batch, same number of ranks, one thread
per rank for everyone. Reports tokens/s (global) and peak resident memory per rank (ru_maxrss, the largest
over ranks) for: strata (`strata bench step`, under mpirun), torch DDP and torch FSDP2 (fully_shard per
block, then the root). Needs torch from PyPI; the project's own tests do not.

    python3 benchmarks/peers/gpt_peers.py --model gpt2-tiny --ranks 2 --micro-batch 4 --steps 5
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

PRESETS = {"gpt2-tiny": (4, 128, 4, 128, 256), "gpt2": (12, 768, 12, 1024, 50257),
           "gpt2-medium": (24, 1024, 16, 1024, 50257)}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_model(L, C, NH, T, V):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, V), tgt.view(-1))

    return GPT()


def worker(rank, world, mode, shape, micro, steps, port, out_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    L, C, NH, T, V = shape
    torch.manual_seed(0)
    model = build_model(L, C, NH, T, V)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for b in model.h:
            fully_shard(b)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, V, (micro, T), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, idx).backward()
        opt.step()

    step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    secs = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"tokens_per_s": steps * micro * T * world / secs, "step_ms": secs / steps * 1e3,
                       "max_rss_mib_per_rank": rss.item()}, f)
    dist.destroy_process_group()


def run_torch(mode, world, shape, micro, steps):
    import torch.multiprocessing as mp
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        port = 29500 + (os.getpid() % 1000)
        mp.spawn(worker, args=(world, mode, shape, micro, steps, port, f.name), nprocs=world, join=True)
        return json.load(open(f.name))


def run_strata(args, shape):
    L, C, NH, T, V = shape
    cmd = [args.mpirun, "-n", str(args.ranks), args.strata, "bench", "step", "--layers", str(L), "--d-model", str(C),
           "--heads", str(NH), "--seq-len", str(T), "--vocab", str(V), "--micro-batch", str(args.micro_batch),
           "--steps", str(args.steps), "--stage", "3", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2-tiny", choices=sorted(PRESETS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=0, help="override the preset's sequence length")
    p.add_argument("--strata", default=os.path.join(ROOT, "build/release/bin/strata"))
    p.add_argument("--mpirun", default=os.path.join(ROOT, "scripts/mpirun_local"))
    args = p.parse_args()
    shape = list(PRESETS[args.model])
    if args.seq_len:
        shape[3] = args.seq_len
    shape = tuple(shape)
    results = {"strata_zero3": run_strata(args, shape)}
    for mode in ("ddp", "fsdp2"):
        results["torch_" + mode] = run_torch(mode, args.ranks, shape, args.micro_batch, args.steps)
    base = results["strata_zero3"]["tokens_per_s"]
    print(f"model {args.model} {shape}, {args.ranks} ranks, micro-batch {args.micro_batch}, 1 thread per rank")
    print(f"{'':14s} {'tokens/s':>10s} {'vs strata':>10s} {'peak RSS/rank':>14s}")
    for name, r in results.items():
        print(f"{name:14s} {r['tokens_per_s']:10.0f} {r['tokens_per_s'] / base:10.2f} {r['max_rss_mib_per_rank']:11.1f} MiB")
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
