#!/usr/bin/env python3
"""strata.torch ZeRO-3 against torch FSDP2 and DeepSpeed ZeRO-3 on CPU: one Hugging Face GPT2LMHeadModel,
measured in one run; and the largest GPT-2 that trains with parameters and optimizer state on NVMe under
an RSS limit per rank.

Every run is the same unmodified GPT2LMHeadModel(GPT2Config(...)) (no download; default GPT2Config is
the 124M model), built the same way by every peer (plain construction on every rank, seed 0), the same
per-rank micro-batches (random tokens from a generator seeded by step and rank), the same rank count,
one thread per rank (torch.set_num_threads(1), OMP_NUM_THREADS=1) and the same launcher
(scripts/mpirun_local). Per rank: tokens/s over the measured steps after the warm-up steps, and the
peak resident set (VmHWM of /proc/self/status: the whole process, torch included). Peers:
  strata    strata.torch.shard, ZeRO-3, its own fused AdamW (the torch optimizer is not used)
  fsdp2     fully_shard per GPT2Block then the root, gloo, torch.optim.AdamW (fused when torch has it)
  deepspeed deepspeed.initialize, ZeRO-3, DS_ACCELERATOR=cpu (gloo without oneCCL), torch's AdamW
            ("torch_adam": DeepSpeed's fused Adam is a CUDA op)
  strata-liveN  strata with strata.max_live_units N (e.g. strata-live2)
  strata-torchrun  strata launched by `torchrun --standalone` instead of mpirun: the engine's collectives on
            torch.distributed's gloo through a foreign communicator (docs/decisions/0033)
  strata-idle  strata with strata.release_idle_memory: the gradient memory gives its pages back after
            each step (docs/decisions/0021-idle-pages.md)
Each peer is measured --repeat times, interleaved (the cores are shared: report every run). Besides
tokens/s, tokens per CPU-second (each rank's process CPU time, all its threads, over the measured steps)
says what tokens/s would be with a core per rank: on a machine shared with other jobs it moves less.

    scripts/python_env                       # build/venv with torch, transformers, mpi4py and strata
    DS_BUILD_OPS=0 build/venv/bin/pip install --no-build-isolation deepspeed
    build/venv/bin/python benchmarks/peers/torch_peers.py --peers strata,fsdp2,deepspeed,strata-live2 \
        --repeat 2 --warmup 1 --steps 3
    build/venv/bin/python benchmarks/peers/torch_peers.py --capacity --peers strata --micro-batch 1 \
        --warmup 1 --steps 1 --nvme-path /tmp/peers-nvme --shapes 12x768,16x1024,20x1024,24x1024

--capacity: for strata (and DeepSpeed ZeRO-Infinity with --peers strata,deepspeed) it trains growing
GPT-2 shapes (n_layer x n_embd, head size 64) for --warmup + --steps steps with offload_param and
offload_optimizer on NVMe under --nvme-path, and reports the largest whose VmHWM stayed under
--rss-limit-mib on every rank (a run whose resident set passes the limit is stopped there).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR, WD = 1e-4, 0.1


# ---------------------------------------------------------------- one rank (`--worker MODE`)
def status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


PHASE = ["start"]  # what the rank is doing, for the watchdog's report


def rss_watchdog(limit_mib):
    """Ends this rank (and so the job) as soon as its resident set passes the limit: a capacity probe
    need not run a too-large model to the end, and the machine is not pushed into swapless OOM."""
    def watch():
        while True:
            if status_mib("VmRSS") > limit_mib:
                over = {"rss_mib": status_mib("VmRSS"), "limit_mib": limit_mib, "phase": PHASE[0]}
                print(f"RSSLIMIT {json.dumps(over)}",
                      flush=True)
                os._exit(3)
            time.sleep(0.05)
    threading.Thread(target=watch, daemon=True).start()


def rank_env():
    """The rank and world size from the launcher (Open MPI's mpirun, or torchrun's variables)."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    return rank, world


def build_model(a):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = GPT2Config() if a.default_config else GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.embd // 64)
    return GPT2LMHeadModel(cfg)


def batch(a, step, rank, vocab):
    import torch
    g = torch.Generator().manual_seed(1000003 * step + rank)
    return torch.randint(0, vocab, (a.micro_batch, a.seq), generator=g)


def decay_groups(model):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}]


def strata_config(a):
    cfg = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": a.micro_batch,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
           "strata": {"optimizer_threads": 1, "weight_decay_1d": False}}  # as the torch groups above
    if a.strata_live:
        cfg["strata"]["max_live_units"] = a.strata_live
    if a.nvme_path:
        for key in ("offload_param", "offload_optimizer"):
            cfg["zero_optimization"][key] = {"device": "nvme", "nvme_path": a.nvme_path}
    cfg["strata"].update(json.loads(a.strata_keys))
    return cfg


def setup_strata(a, model):
    import strata.torch as st
    engine = st.shard(model, strata_config(a))

    def step(x, mark):
        loss = model(x, labels=x).loss
        mark("forward")
        loss.backward()
        mark("backward")
        engine.step()
        mark("step")
        return loss

    def done():
        stats = engine.stats()
        engine.close()
        return {"engine_peak_mib": stats["device_peak_bytes"] / 2**20}

    return step, lambda: st.all_reduce_mean(0.0), done  # a barrier under either launcher


def init_gloo(rank, world):
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    return dist


def setup_fsdp2(a, model, rank, world):
    import torch
    dist = init_gloo(rank, world)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    try:
        opt = torch.optim.AdamW(decay_groups(model), lr=LR, fused=True)
        fused = True
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(decay_groups(model), lr=LR)
        fused = False

    def step(x, mark):
        loss = model(x, labels=x).loss
        mark("forward")
        loss.backward()
        mark("backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark("step")
        return loss

    def done():
        dist.destroy_process_group()
        return {"fused_adamw": fused}

    return step, dist.barrier, done


def deepspeed_config(a):
    zero = {"stage": 3}
    if a.nvme_path:
        zero["offload_param"] = {"device": "nvme", "nvme_path": a.nvme_path, "pin_memory": False}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": a.nvme_path, "pin_memory": False}
    adam = {"lr": LR, "weight_decay": WD}
    if not a.nvme_path:
        adam["torch_adam"] = True  # DeepSpeed's FusedAdam is a CUDA op; with offload it uses DeepSpeedCPUAdam
    return {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": adam},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def setup_deepspeed(a, model, rank, world):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist = init_gloo(rank, world)
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=decay_groups(model),
                                           config=deepspeed_config(a))

    def step(x, mark):
        loss = engine(x, labels=x).loss
        mark("forward")
        engine.backward(loss)
        mark("backward")
        engine.step()
        mark("step")
        return loss

    def done():
        dist.destroy_process_group()
        return {"deepspeed": deepspeed.__version__}

    return step, dist.barrier, done


def worker(a):
    rank, world = rank_env()
    if a.rss_limit_mib:
        rss_watchdog(a.rss_limit_mib)
    import torch
    torch.set_num_threads(1)
    t_init = time.perf_counter()
    phases = []  # (phase, VmRSS, VmHWM) in MiB: after import, model build, sharding, and each step's parts

    def mark(name):
        phases.append((name, round(status_mib("VmRSS")), round(status_mib("VmHWM"))))

    mark("import")
    hwm_import = status_mib("VmHWM")
    PHASE[0] = "building the torch model"
    model = build_model(a)
    model.train()
    hwm_model = status_mib("VmHWM")
    mark("model")
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    PHASE[0] = "sharding (the torch model and the engine's buffers)"
    if a.worker == "strata":
        step, barrier, done = setup_strata(a, model)
    elif a.worker == "fsdp2":
        step, barrier, done = setup_fsdp2(a, model, rank, world)
    else:
        step, barrier, done = setup_deepspeed(a, model, rank, world)
    init_s = time.perf_counter() - t_init
    hwm_init = status_mib("VmHWM")
    mark("shard")
    losses = []
    PHASE[0] = "training"
    for s in range(a.warmup):
        losses.append(step(batch(a, s, rank, vocab), lambda n, s=s: mark(f"{n}{s}")).item())
    barrier()
    step_s = []
    c0 = time.process_time()
    t0 = time.perf_counter()
    for s in range(a.warmup, a.warmup + a.steps):
        t = time.perf_counter()
        losses.append(step(batch(a, s, rank, vocab), lambda n, s=s: mark(f"{n}{s}")).item())
        step_s.append(time.perf_counter() - t)
    barrier()
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0
    extra = done()
    out = {"rank": rank, "world": world, "params": n_params, "seconds": secs, "cpu_s": cpu, "init_s": init_s,
           "step_s": step_s, "tokens_per_s_rank": a.steps * a.micro_batch * a.seq / secs,
           "vmhwm_mib": status_mib("VmHWM"), "vmhwm_init_mib": hwm_init, "vmhwm_import_mib": hwm_import,
           "vmhwm_model_mib": hwm_model, "vmrss_mib": status_mib("VmRSS"), "losses": losses, "phases": phases}
    out.update(extra)
    print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- the driver
def results_in(text, marker="RESULT "):
    """Every rank's RESULT object (or another marker's) in the job's output. The ranks share one stdout, so two
    ranks' lines can land on one line ("RESULT {...}RESULT {...}"): each object is decoded where its marker
    starts."""
    out, dec, at = [], json.JSONDecoder(), text.find(marker)
    while at >= 0:
        obj, end = dec.raw_decode(text, at + len(marker))
        out.append(obj)
        at = text.find(marker, end)
    return out


def launch(a, mode, shape=None, nvme=None, limit=None, timeout=3600):
    """One measurement: `ranks` processes of this file in --worker mode; returns the per-rank results."""
    live = a.strata_live
    keys = a.strata_keys
    if mode.startswith("strata-live"):  # strata with strata.max_live_units set, e.g. strata-live2
        mode, live = "strata", int(mode[len("strata-live"):])
    if mode == "strata-idle":  # strata whose gradient memory gives its pages back between steps
        mode, keys = "strata", json.dumps(dict(json.loads(keys), release_idle_memory=True))
    launcher = [os.path.join(ROOT, "scripts/mpirun_local"), "-n", str(a.ranks), sys.executable]
    if mode == "strata-torchrun":  # gloo through the foreign communicator; its rendezvous binds its own port
        mode, launcher = "strata", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                    str(a.ranks)]
    cmd = launcher + [os.path.abspath(__file__), "--worker", mode, "--micro-batch", str(a.micro_batch), "--seq", str(a.seq),
           "--warmup", str(a.warmup), "--steps", str(a.steps)]
    if shape is None:
        cmd += ["--default-config"]
    else:
        cmd += ["--layers", str(shape[0]), "--embd", str(shape[1])]
    if nvme:
        cmd += ["--nvme-path", nvme]
    if limit:
        cmd += ["--rss-limit-mib", str(limit)]
    if live:
        cmd += ["--strata-live", str(live)]
    cmd += ["--strata-keys", keys]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000))
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    ranks = results_in(text)
    over = [json.loads(l[len("RSSLIMIT "):]) for l in text.splitlines() if l.startswith("RSSLIMIT ")]
    res = {"mode": mode, "max_live_units": live, "rc": rc, "wall_s": time.time() - t, "ranks": sorted(ranks, key=lambda r: r["rank"])}
    if over:
        res["over_limit"] = over
    if len(ranks) != a.ranks:
        res["error"] = "\n".join(text.splitlines()[-a.error_lines:])
    return res


def summary(r):
    if "error" in r:
        return None
    ranks = r["ranks"]
    tokens_rank = ranks[0]["tokens_per_s_rank"] * ranks[0]["seconds"]
    return {"tokens_per_s": sum(x["tokens_per_s_rank"] for x in ranks),
            # per CPU-second of each rank's process (all its threads), summed over ranks: what tokens/s would
            # be with a core per rank; less moved by the other sessions' load than tokens/s
            "tokens_per_cpu_s": sum(tokens_rank / x["cpu_s"] for x in ranks),
            "step_s": max(x["seconds"] for x in ranks) / len(ranks[0]["step_s"]),
            "peak_rss_mib": [round(x["vmhwm_mib"]) for x in ranks], "init_s": max(x["init_s"] for x in ranks),
            "final_loss": ranks[0]["losses"][-1], "engine_peak_mib": ranks[0].get("engine_peak_mib"),
            "phases": [x["phases"] for x in ranks]}


def compare(a):
    modes = a.peers.split(",")
    runs = {m: [] for m in modes}
    for rep in range(a.repeat):
        for m in modes:
            r = launch(a, m)
            runs[m].append(r)
            s = summary(r)
            failed = f"FAILED (rc {r['rc']})\n{r.get('error', '')}"
            print(f"[{rep}] {m}: {json.dumps(s) if s else failed}", flush=True)
    print(f"\nHF GPT2LMHeadModel(GPT2Config()), seq {a.seq}, micro-batch {a.micro_batch} per rank, {a.ranks} ranks "
          f"x 1 thread, {a.warmup} warm-up + {a.steps} measured steps; each run listed")
    print(f"{'peer':14s} {'tokens/s':>14s} {'tokens/CPU-s':>14s} {'peak RSS per rank (MiB)':>28s}")
    for m in modes:
        ok = [summary(r) for r in runs[m] if summary(r)]
        tps = ", ".join(f"{s['tokens_per_s']:.1f}" for s in ok) or "failed"
        tpc = ", ".join(f"{s['tokens_per_cpu_s']:.1f}" for s in ok)
        rss = "; ".join("/".join(str(v) for v in s["peak_rss_mib"]) for s in ok)
        print(f"{m:14s} {tps:>14s} {tpc:>14s} {rss:>28s}")
    print("\nVmRSS / VmHWM (MiB) of rank 0 after each phase (import, model build, sharding, then forward, backward "
          "and step of each step), last run of each peer")
    for m in modes:
        ok = [summary(r) for r in runs[m] if summary(r)]
        if ok:
            print(f"{m:14s} " + "  ".join(f"{n} {rss}/{hwm}" for n, rss, hwm in ok[-1]["phases"][0]))
    return runs


SHAPES = "12x768,16x1024,20x1024,24x1024,36x1280,48x1600"  # n_layer x n_embd, growing


def capacity(a):
    out = {}
    os.makedirs(a.nvme_path, exist_ok=True)
    for m in a.peers.split(","):
        os.makedirs(os.path.join(a.nvme_path, m), exist_ok=True)
        fits, tried = None, []
        for L, C in (tuple(int(v) for v in x.split("x")) for x in a.shapes.split(",")):
            r = launch(a, m, (L, C), nvme=os.path.join(a.nvme_path, m), limit=a.rss_limit_mib)
            s = summary(r)
            params = 12 * L * C * C + 50257 * C + 1024 * C  # GPT-2: 12 C^2 per block, wte, wpe (biases aside)
            row = {"layers": L, "embd": C, "approx_params": params, "ok": s is not None, **(s or {})}
            if s is None:
                row["why"] = (f"over the RSS limit: {r['over_limit'][0]}" if "over_limit" in r else r["error"])
            tried.append(row)
            print(f"{m} {L}x{C} (~{params / 1e6:.0f}M): " + (json.dumps(s) if s else "FAILED: " + row["why"][-2000:]),
                  flush=True)
            if s is None:
                break
            fits = row
        out[m] = {"largest": fits, "tried": tried}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", choices=("strata", "fsdp2", "deepspeed"), help=argparse.SUPPRESS)
    p.add_argument("--default-config", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--peers", default="strata,fsdp2,deepspeed")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--strata-live", type=int, default=0, help="strata.max_live_units (default: strata.torch's)")
    p.add_argument("--strata-keys", default="{}", help='more strata.* keys for strata.torch, as JSON: '
                   '\'{"optimizer_in_backward": true}\'')
    p.add_argument("--capacity", action="store_true")
    p.add_argument("--shapes", default=SHAPES, help="--capacity: n_layer x n_embd shapes to try, growing")
    p.add_argument("--nvme-path", default=None)
    p.add_argument("--rss-limit-mib", type=int, default=0)
    p.add_argument("--error-lines", type=int, default=30)
    p.add_argument("--json", default=None, help="write every run's results here")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.capacity:
        a.nvme_path = a.nvme_path or "/tmp/torch-peers-nvme"
        a.rss_limit_mib = a.rss_limit_mib or 4096
        res = capacity(a)
        for m, r in res.items():
            big = r["largest"]
            print(f"{m}: largest under {a.rss_limit_mib} MiB RSS per rank: " +
                  (f"{big['layers']} x {big['embd']} (~{big['approx_params'] / 1e6:.0f}M params), peak RSS "
                   f"{big['peak_rss_mib']} MiB, {big['tokens_per_s']:.0f} tokens/s" if big else "none"))
    else:
        res = compare(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
