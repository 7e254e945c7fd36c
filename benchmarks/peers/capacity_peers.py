#!/usr/bin/env python3
"""The largest GPT that trains 3 steps with parameters and optimizer state on NVMe under one host-memory limit:
Strata (`strata bench step`, the C++ GPT) against DeepSpeed ZeRO-Infinity (a Hugging Face GPT2LMHeadModel of
the same shape, built under deepspeed.zero.Init so the full model never exists in memory).

Both systems run the same shapes (--layers L for each L in the list, at --d-model, --heads, --seq, --micro-batch,
--vocab; wte tied to the output, n_positions = seq, so both count the same parameters), one rank, one thread
(OMP_NUM_THREADS=1; strata --optimizer-threads 1; torch.set_num_threads(1)), fp32, AdamW, 1 warm-up and 2 timed
steps. Each candidate is one child process (the rank itself, no launcher), watched the same way for both:
  - its VmRSS polled every 50 ms; past --rss-limit-mib it is sent SIGTERM (then SIGKILL) and fails there;
  - its disk use: the blocks of the files under its NVMe directory and of the files it holds open there
    (Strata unlinks its swap files once open), polled every 0.5 s; past --disk-limit-gb it is stopped too;
  - its peak RSS: ru_maxrss from wait4, exact.
Per system the search goes up the --layers list and stops at the first candidate that fails, saying why.
The free space of --nvme-path must stay above --min-free-gb, before and during each candidate (the disk may be
shared: a candidate that brings it below is stopped, and the search ends). Every candidate is
appended to --results (JSON lines) as it ends; the table is printed at the end.

    OMP_NUM_THREADS=1 /work/venv-torch/bin/python benchmarks/peers/capacity_peers.py --build-ops   # once
    OMP_NUM_THREADS=1 /work/venv-torch/bin/python benchmarks/peers/capacity_peers.py \
        --strata build/release/bin/strata --ds-adam torch --ds-max-in-cpu 0   # the shapes and limit of perf-notes

DeepSpeed's CPU ops (async_io for the NVMe swapper; cpu_adam with --ds-adam cpu) are C++ extensions that
torch JIT-compiles on first use into $TORCH_EXTENSIONS_DIR (default here: ~/.cache/torch_extensions): run
--build-ops once, outside the timed search.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peers  # noqa: E402  (shared: the data, the gloo setup, the DeepSpeed config, LR and WD)

MIB = 2**20


# ---------------------------------------------------------------- the DeepSpeed rank (`--worker`)
def ds_config(a):
    """torch_peers' ZeRO-3 config with offload_param and offload_optimizer on NVMe, plus the knobs that
    bound DeepSpeed's host memory: swap buffers sized to the largest parameter (the tied embedding), small
    optimizer sub-groups, and the async I/O settings."""
    cfg = torch_peers.deepspeed_config(a)
    zero = cfg["zero_optimization"]
    largest = a.vocab * a.d_model
    zero["offload_param"].update(buffer_count=a.ds_param_buffers, buffer_size=largest)
    if a.ds_max_in_cpu is not None:  # DeepSpeed's default 1e9: up to 1e9 parameters' partitions stay in memory
        zero["offload_param"]["max_in_cpu"] = a.ds_max_in_cpu
    zero["offload_optimizer"].update(buffer_count=4)
    zero.update(sub_group_size=a.ds_sub_group, reduce_bucket_size=largest, stage3_max_live_parameters=largest,
                stage3_max_reuse_distance=largest, stage3_prefetch_bucket_size=largest // 4,
                stage3_param_persistence_threshold=10 * a.d_model)
    cfg["aio"] = {"block_size": 1 << 20, "queue_depth": 32, "intra_op_parallelism": 1, "single_submit": False,
                  "overlap_events": True}
    if a.ds_adam == "torch":
        cfg["optimizer"]["params"]["torch_adam"] = True  # torch.optim.AdamW on the swapped-in state
    return cfg


def phase(name):
    print("PHASE " + name, flush=True)


def ds_worker(a):
    import torch
    torch.set_num_threads(1)
    dist = torch_peers.init_gloo(0, 1)
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    import deepspeed.comm.torch  # noqa: F401 (the package's `torch` attribute is torch itself: use sys.modules)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # one rank: no shm collectives to JIT-compile
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    cfg = ds_config(a)
    phase("building the model under deepspeed.zero.Init")
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="nvme"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=a.layers, n_embd=a.d_model, n_head=a.heads, n_positions=a.seq,
                                           vocab_size=a.vocab))
    model.train()
    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    decay = [p for p in model.parameters() if len(getattr(p, "ds_shape", p.shape)) >= 2]
    rest = [p for p in model.parameters() if len(getattr(p, "ds_shape", p.shape)) < 2]
    groups = [{"params": decay, "weight_decay": torch_peers.WD}, {"params": rest, "weight_decay": 0.0}]
    phase("deepspeed.initialize")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    losses, step_s = [], []
    for s in range(3):
        phase(f"step {s}")
        t = time.perf_counter()
        x = torch_peers.batch(a, s, 0, a.vocab)
        loss = engine(x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        step_s.append(time.perf_counter() - t)
    phase("done")
    print("RESULT " + json.dumps({"params": params, "step_s": step_s, "losses": losses,
                                  "deepspeed": deepspeed.__version__}), flush=True)
    dist.destroy_process_group()


def build_ops(a):
    """JIT-compiles DeepSpeed's CPU ops once (into $TORCH_EXTENSIONS_DIR), outside any timed run."""
    from deepspeed.accelerator import get_accelerator
    for name in ["AsyncIOBuilder"] + (["CPUAdamBuilder"] if a.ds_adam == "cpu" else []):
        t = time.time()
        get_accelerator().create_op_builder(name).load()
        print(f"{name}: loaded in {time.time() - t:.0f} s (TORCH_EXTENSIONS_DIR="
              f"{os.environ.get('TORCH_EXTENSIONS_DIR', '~/.cache/torch_extensions')})", flush=True)


# ---------------------------------------------------------------- one candidate, watched
def params_of(a, layers):
    C = a.d_model  # the same count for both: GPT-2 blocks with biases, wte tied, wpe of seq rows, ln_f
    return a.vocab * C + a.seq * C + layers * (12 * C * C + 13 * C) + 2 * C


def disk_bytes(pid, root):
    """Blocks held by the files under root and by the files the process holds open there (unlinked ones too)."""
    seen = {}
    paths = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    try:
        fds = [os.path.join(f"/proc/{pid}/fd", fd) for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(fd).startswith(root):
                paths.append(fd)
        except OSError:
            pass
    for p in paths:
        try:
            st = os.stat(p)
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        except OSError:
            pass
    return sum(seen.values())


def vmrss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def run_watched(a, cmd, nvme, env):
    """Runs cmd as a child, stops it past the RSS or disk limit or the timeout; returns what was seen."""
    out_path = nvme + ".log"
    with open(out_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    seen = {"peak_disk_bytes": 0, "stopped": None, "running": True}

    def stop(why):
        seen["stopped"], seen["stopped_at"] = why, time.time()
        os.kill(p.pid, signal.SIGTERM)  # Strata removes its offload files on SIGTERM

    def disk():  # only the main loop reaps the child (wait4), so this polls a flag, not the process
        while seen["running"]:
            seen["peak_disk_bytes"] = max(seen["peak_disk_bytes"], disk_bytes(p.pid, nvme))
            time.sleep(0.5)
    threading.Thread(target=disk, daemon=True).start()
    t0 = time.time()
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        rss = vmrss_mib(p.pid)
        if seen["stopped"] is None:
            if rss > a.rss_limit_mib:
                stop(f"VmRSS {rss:.0f} MiB passed the {a.rss_limit_mib} MiB limit")
            elif seen["peak_disk_bytes"] > a.disk_limit_gb * 1e9:
                stop(f"disk use {seen['peak_disk_bytes'] / 1e9:.1f} GB passed the {a.disk_limit_gb} GB limit")
            elif shutil.disk_usage(nvme).free < a.min_free_gb * 1e9:
                stop(f"free disk under {nvme} fell below --min-free-gb {a.min_free_gb:g} GB (the disk is shared)")
            elif time.time() - t0 > a.timeout:
                stop(f"timed out after {a.timeout} s")
        elif time.time() - seen["stopped_at"] > 10:
            os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.05)
    seen["running"] = False
    p.returncode = os.waitstatus_to_exitcode(status)
    with open(out_path) as f:
        text = f.read()
    os.remove(out_path)
    seen.pop("stopped_at", None)
    return dict(seen, rc=p.returncode, wall_s=time.time() - t0, peak_rss_mib=ru.ru_maxrss / 1024.0, text=text)


def candidate(a, system, layers):
    nvme = os.path.join(a.nvme_path, f"{system}-{layers}")
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000), PYTHONUNBUFFERED="1")
    shape = ["--layers", str(layers), "--heads", str(a.heads), "--micro-batch", str(a.micro_batch)]
    if system == "strata":
        budget = f"{a.rss_limit_mib}MiB"
        cmd = [a.strata, "bench", "step", "--json", "--device", "host", "--d-model", str(a.d_model),
               "--seq-len", str(a.seq), "--vocab", str(a.vocab), "--steps", "2", "--optimizer-threads", "1",
               "--offload-params", "nvme", "--offload-optimizer", "nvme", "--nvme-path", nvme,
               "--optimizer-in-backward", "--device-budget", budget, "--host-budget", budget] + shape
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--d-model", str(a.d_model), "--seq",
               str(a.seq), "--vocab", str(a.vocab), "--nvme-path", nvme, "--ds-adam", a.ds_adam,
               "--ds-param-buffers", str(a.ds_param_buffers), "--ds-sub-group", str(a.ds_sub_group)] + shape
        cmd += [] if a.ds_max_in_cpu is None else ["--ds-max-in-cpu", str(a.ds_max_in_cpu)]
    r = run_watched(a, cmd, nvme, env)
    shutil.rmtree(nvme, ignore_errors=True)
    lines = r.pop("text").splitlines()
    row = {"system": system, "layers": layers, "params": params_of(a, layers), "rc": r["rc"],
           "wall_s": round(r["wall_s"], 1), "peak_rss_mib": round(r["peak_rss_mib"]),
           "peak_disk_gb": round(r["peak_disk_bytes"] / 1e9, 2)}
    if system == "strata":
        res = [json.loads(l) for l in lines if l.startswith("{")]
        if res:
            row.update(step_s=res[0]["step_ms"] / 1e3, params=res[0]["params"])
    else:
        res = [json.loads(l[len("RESULT "):]) for l in lines if l.startswith("RESULT ")]
        if res:
            row.update(step_s=sum(res[0]["step_s"][1:]) / 2, params=res[0]["params"], losses=res[0]["losses"])
    row["ok"] = bool(res) and r["rc"] == 0 and r["stopped"] is None
    if not row["ok"]:
        phases = [l[len("PHASE "):] for l in lines if l.startswith("PHASE ")]
        row["why"] = (r["stopped"] or f"exit code {r['rc']}") + (f" (in: {phases[-1]})" if phases else "")
        row["tail"] = "\n".join(l for l in lines if not l.startswith("PHASE "))[-a.tail_chars:]
    return row


def search(a):
    rows = []
    for system in a.systems.split(","):
        for layers in (int(v) for v in a.layers.split(",")):
            free = shutil.disk_usage(a.nvme_path).free / 1e9
            if free < a.min_free_gb:
                rows.append({"system": system, "layers": layers, "ok": False,
                             "why": f"not run: {free:.1f} GB free under {a.nvme_path}, below --min-free-gb"})
                print(json.dumps(rows[-1]), flush=True)
                return rows
            print(f"{system} {layers} layers (~{params_of(a, layers) / 1e6:.0f}M params), {free:.0f} GB free ...",
                  flush=True)
            rows.append(candidate(a, system, layers))
            print(json.dumps(rows[-1]), flush=True)
            if a.results:
                with open(a.results, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
            if not rows[-1]["ok"]:
                break
    return rows


def table(a, rows):
    print(f"\nGPT d_model {a.d_model}, heads {a.heads}, seq {a.seq}, micro-batch {a.micro_batch}, vocab {a.vocab}; "
          f"1 rank x 1 thread; VmRSS limit {a.rss_limit_mib} MiB, disk limit {a.disk_limit_gb} GB")
    print(f"{'system':10s} {'layers':>6s} {'params':>8s} {'result':>8s} {'step s':>8s} {'peak RSS MiB':>13s} "
          f"{'disk GB':>8s}  why")
    for r in rows:
        step = f"{r['step_s']:.2f}" if "step_s" in r else "-"
        print(f"{r['system']:10s} {r['layers']:6d} {r.get('params', 0) / 1e6:7.1f}M {'trains' if r['ok'] else 'fails':>8s}"
              f" {step:>8s} {r.get('peak_rss_mib', 0):13d} {r.get('peak_disk_gb', 0):8.2f}  {r.get('why', '')}")
    for system in a.systems.split(","):
        ok = [r for r in rows if r["system"] == system and r["ok"]]
        print(f"{system}: largest that trains 3 steps: " +
              (f"{ok[-1]['layers']} layers, {ok[-1]['params'] / 1e6:.1f}M params" if ok else "none"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--build-ops", action="store_true", help="JIT-compile DeepSpeed's CPU ops and exit")
    p.add_argument("--systems", default="strata,deepspeed")
    p.add_argument("--strata", default="build/release/bin/strata", help="the strata binary")
    p.add_argument("--layers", default="8,12,16,24,48,80,96", help="depths to try, growing (the search stops at the "
                   "first that fails); with --worker: the depth")
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--rss-limit-mib", type=int, default=4096, help="VmRSS limit of the rank")
    p.add_argument("--disk-limit-gb", type=float, default=10.0, help="disk use limit of a candidate")
    p.add_argument("--nvme-path", default="/tmp/capacity-peers")
    p.add_argument("--min-free-gb", type=float, default=12.0, help="run no candidate when --nvme-path has less "
                   "free, and stop one that brings it below")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per candidate")
    p.add_argument("--ds-adam", choices=("cpu", "torch"), default="cpu",
                   help="DeepSpeed's optimizer: DeepSpeedCPUAdam (cpu_adam op) or torch.optim.AdamW")
    p.add_argument("--ds-param-buffers", type=int, default=5, help="offload_param.buffer_count")
    p.add_argument("--ds-sub-group", type=int, default=10**7, help="zero_optimization.sub_group_size")
    p.add_argument("--ds-max-in-cpu", type=int, default=None, help="offload_param.max_in_cpu (DeepSpeed's "
                   "default, 1e9, keeps that many parameters in host memory besides NVMe; 0 keeps none)")
    p.add_argument("--results", default=None, help="append each candidate here (JSON lines)")
    p.add_argument("--tail-chars", type=int, default=1500, help="output kept of a failed candidate")
    a = p.parse_args()
    if a.worker:
        a.layers = int(a.layers)
        return ds_worker(a)
    if a.build_ops:
        return build_ops(a)
    os.makedirs(a.nvme_path, exist_ok=True)
    table(a, search(a))


if __name__ == "__main__":
    sys.exit(main())
