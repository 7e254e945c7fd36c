#!/usr/bin/env python3
"""A model larger than each rank's memory limit, from its first line: created sharded or loaded from a Hugging
Face checkpoint, trained 3 steps with NVMe offload, exported. Strata against FSDP2 and DeepSpeed, one run.

The model: a Hugging Face LlamaForCausalLM built from a LlamaConfig (--layers, --hidden, --ffn, --heads,
--kv-heads, --vocab; the defaults are about 1.5B parameters, 5.9 GB of fp32). Each system runs --ranks ranks,
one thread each, each rank watched by its own RSS watchdog (torch_peers.rss_watchdog: past --rss-limit-mib the
rank ends and the candidate fails, naming the phase). Candidates (--peers):
  strata-created   st.shard(lambda: LlamaForCausalLM(cfg), config): parameters created sharded
  strata-loaded    the same, then engine.load_pretrained(checkpoint): each rank reads its shards' byte ranges
  strata-pretrained  st.shard(lambda: LlamaForCausalLM(cfg), config, pretrained=checkpoint): the same values, the
                   random initialisation of what the checkpoint supplies never computed (decision 0034)
  fsdp2-meta       torch's recipe: the model on the meta device, fully_shard per decoder layer and the root,
                   to_empty, then each rank initialises its own shards (HF _init_weights on the DTensors)
  fsdp2-dcp        the same, then torch.distributed.checkpoint.load with HuggingFaceStorageReader
  deepspeed-init   the model built under deepspeed.zero.Init (ZeRO-3, parameters and optimizer on NVMe)
Strata and DeepSpeed offload parameters and optimizer state to --nvme-path (Strata updates each unit in backward,
strata.optimizer_in_backward, so it keeps no gradient shard); FSDP2 has no NVMe tier on the host
(its CPUOffloadPolicy moves GPU shards to host memory), so it holds its shards, gradients and AdamW state in
memory. Each rank reports: peak RSS (VmHWM), the seconds from the end of its imports to the end of the first
step ("first step"), the load's seconds where it loads, and the export's where it exports. The checkpoint
(written once by this driver, one tensor at a time, into --ckpt-dir) is read by fio in the same run: the load's
floor is its bytes over fio's sequential read bandwidth (O_DIRECT, 1 MiB blocks, 4 jobs).
DeepSpeed's NVMe swapper is a C++ op (async_io, needs libaio-dev) that torch JIT-compiles on first use into
$TORCH_EXTENSIONS_DIR: build it once, outside the timed run, with --build-ops.

    build/venv/bin/python benchmarks/peers/sharded_start_peers.py --nvme-path /work/nvme-bench \
        --ckpt-dir /work/llama-ckpt --peers strata-created,strata-loaded,fsdp2-meta,fsdp2-dcp,deepspeed-init

With --save-compare each Strata candidate, after its steps, saves the same state synchronously and then
asynchronously (docs/decisions/0036, 0046: the optimizer state on NVMe is held, not copied), takes one step
(--steps-over-save N: N) while the asynchronous save is written, waits for it, and reports both stalls and the
resident-set growth of the asynchronous save (a table after the main one); --async-saves N takes N of them, the
later ones into the first one's reused snapshot buffers, each after a step without a save (a table per save, with
the share of the shard files' bytes still shared with the NVMe files after the wait: cloned, decision 0057).
A tiny shape runs it in a minute:

    build/venv/bin/python benchmarks/peers/sharded_start_peers.py --nvme-path /tmp/nvme-bench \
        --ckpt-dir /tmp/tiny-ckpt --peers strata-created --save-compare --ranks 2 --layers 2 --hidden 64 \
        --ffn 128 --heads 4 --kv-heads 2 --vocab 256 --steps 3

docs/perf-notes.md ("Bigger than a rank") has the table and its reading.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peers  # noqa: E402  (rss_watchdog, status_mib, results_in, rank_env)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR = 1e-4
SAVE_COMPARE = {}  # "run": the Strata candidate's save comparison (strata_setup), run by worker()


def llama_config(a):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                       num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                       max_position_embeddings=a.seq, tie_word_embeddings=False)


# ---------------------------------------------------------------- one rank (`--worker MODE`)
def probe_creation(marks):
    """Each Strata rank prints (a PROBE line, before anything can stop it) its VmRSS and the engine's bytes right
    after Finalize, when the pools exist and no value is loaded yet, and then the peak RSS of the creation replay
    (st.shard runs it in Created.load; VmHWM reset through /proc/self/clear_refs before it, the run's peak keeps
    the one before)."""
    from strata.torch import _created
    load = _created.Created.load

    def probed(self, engine, skip=frozenset()):
        s = engine.stats()
        marks.update(finalized_rss_mib=torch_peers.status_mib("VmRSS"),
                     finalized_hwm_mib=torch_peers.status_mib("VmHWM"), device_mib=s["device_current_bytes"] / 2**20,
                     pinned_mib=s["pinned_host_current_bytes"] / 2**20, units=len(engine.units),
                     largest_unit_mib=max(4 * u.layout.total for u in engine.units) / 2**20)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        print("PROBE " + json.dumps(dict(marks, rank=torch_peers.rank_env()[0])), flush=True)
        load(self, engine, skip)
        marks.update(creating_peak_mib=torch_peers.status_mib("VmHWM"), created_rss_mib=torch_peers.status_mib("VmRSS"))
        print("PROBE " + json.dumps(dict(marks, rank=torch_peers.rank_env()[0])), flush=True)

    _created.Created.load = probed


def shared_bytes(path):
    """Bytes of `path` in extents the file system shares with another file (FIEMAP_EXTENT_SHARED): the blocks an
    asynchronous save cloned from the NVMe files (decision 0057) and no step has written since."""
    import fcntl
    import struct
    fs_ioc_fiemap, count, shared, start = 0xC020660B, 256, 0, 0
    with open(path, "rb") as f:
        while True:
            req = bytearray(struct.pack("QQIIII", start, (1 << 64) - 1 - start, 1, 0, count, 0) + bytes(56 * count))
            fcntl.ioctl(f.fileno(), fs_ioc_fiemap, req)
            mapped = struct.unpack_from("I", req, 20)[0]
            last = False
            for i in range(mapped):
                logical, _, length = struct.unpack_from("QQQ", req, 32 + 56 * i)
                flags = struct.unpack_from("I", req, 32 + 56 * i + 40)[0]
                shared += length if flags & 0x2000 else 0  # FIEMAP_EXTENT_SHARED
                last = last or flags & 0x1  # FIEMAP_EXTENT_LAST
                start = logical + length
            if mapped == 0 or last:
                return shared


def strata_setup(a, cfg, mode, marks):
    import strata.torch as st
    from transformers import LlamaForCausalLM
    nvme = os.path.join(a.nvme_path, f"strata-{torch_peers.rank_env()[0]}")
    os.makedirs(nvme, exist_ok=True)
    offload = {"device": "nvme", "nvme_path": nvme} if a.strata_offload == "nvme" else {"device": "cpu"}
    config = {"zero_optimization": {"stage": 3, "offload_param": offload, "offload_optimizer": offload},
              "train_micro_batch_size_per_gpu": a.micro_batch,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              # the update in backward (decision 0018): no fp32 gradient shard is kept (decision 0040); the idle
              # gradient pool and scratch give their pages back after each step (decision 0021), for the export
              "strata": {"optimizer_threads": 1, "collective_timeout_ms": 3600000, "optimizer_in_backward": True,
                         "release_idle_memory": True}}
    torch_peers.PHASE[0] = "creating the model sharded"
    probe_creation(marks)
    engine = st.shard(lambda: LlamaForCausalLM(cfg), config,
                      pretrained=a.ckpt_dir if mode == "strata-pretrained" else None)
    model = engine.model
    if mode == "strata-pretrained":  # loaded inside st.shard: the load's own seconds, as the library timed them
        from strata.torch import _pretrained
        marks["load_s"] = _pretrained.last_load_stats["seconds"]
    if mode == "strata-loaded":
        torch_peers.PHASE[0] = "loading the checkpoint"
        t = time.perf_counter()
        engine.load_pretrained(a.ckpt_dir)
        marks["load_s"] = time.perf_counter() - t
        from strata.torch import _pretrained
        load = _pretrained.last_load_stats  # this rank's reads, and what the load wrote to its NVMe offload
        marks.update(load_bytes_read=load["bytes_read"], load_nvme_bytes_written=load["nvme_bytes_written"],
                     load_nvme_bytes_read=load["nvme_bytes_read"], nvme_bytes=engine.stats()["nvme_current_bytes"])

    def step(x):
        loss = model(x, labels=x).loss
        loss.backward()
        engine.step()
        return loss

    def export(path):
        engine.save_pretrained(path, max_shard_size="1GB")

    def save_compare(marks, batch, step_s):
        """A synchronous and an asynchronous save of the same state; one step while the latter is written."""
        root = os.path.join(a.nvme_path, "save-compare")  # the same directory on every rank
        torch_peers.PHASE[0] = "synchronous save"
        t = time.perf_counter()
        engine.save_checkpoint(os.path.join(root, "sync"))
        marks["sync_save_s"] = time.perf_counter() - t
        # Published (the save is collective): its room back for the next one. Each rank removes its own shard, so
        # the ranks reach the next save together (its first call sets up a communicator, collectively); rank 0
        # removes what is left after the comparison.
        for name in glob.glob(os.path.join(root, "sync", "*", f"shard_{torch_peers.rank_env()[0]:05d}.bin")):
            os.remove(name)
        # --async-saves N: N asynchronous saves of the state, the second and later after a step without a save
        # (their reference); from the second on the snapshot's host buffers are reused (decision 0036).
        marks["async_runs"] = []
        for i in range(a.async_saves):
            if i > 0:
                torch_peers.PHASE[0] = "step before an asynchronous save"
                t = time.perf_counter()
                step(batch)
                step_s = time.perf_counter() - t
            torch_peers.PHASE[0] = "asynchronous save"
            run = {"step_before_s": step_s}
            rss = torch_peers.status_mib("VmRSS")
            t = time.perf_counter()
            engine.save_checkpoint(os.path.join(root, f"async-{i}"), async_save=True)
            run["call_s"] = time.perf_counter() - t
            rss_max = torch_peers.status_mib("VmRSS")
            t = time.perf_counter()
            for _ in range(a.steps_over_save):
                step(batch)  # on every rank (collective), whatever this rank's writer is doing
            run["step_s"] = time.perf_counter() - t
            rss_max = max(rss_max, torch_peers.status_mib("VmRSS"))
            t = time.perf_counter()
            engine.wait_checkpoint()
            run["wait_s"] = time.perf_counter() - t
            run["shared_bytes"], run["file_bytes"] = 0, 0
            for name in glob.glob(os.path.join(root, f"async-{i}", "*", f"shard_{torch_peers.rank_env()[0]:05d}.bin")):
                run["shared_bytes"] += shared_bytes(name)
                run["file_bytes"] += os.path.getsize(name)
                os.remove(name)  # published: its room back for the next one
            # the stall: the call, what the steps lost against the one before, and the wait for the rest
            run["stall_s"] = run["call_s"] + run["step_s"] - a.steps_over_save * run["step_before_s"] + run["wait_s"]
            run["rss_growth_mib"] = rss_max - rss
            marks["async_runs"].append(run)
        first = marks["async_runs"][0]
        marks.update(async_call_s=first["call_s"], async_step_s=first["step_s"], async_wait_s=first["wait_s"],
                     async_stall_s=first["stall_s"], async_rss_growth_mib=first["rss_growth_mib"],
                     step_before_s=first["step_before_s"])
        # What is left of `root` (manifests) goes with the next launch's cleanup: removing it here, on rank 0, would race
        # the other ranks still measuring their last shard (shared_bytes).

    SAVE_COMPARE["run"] = save_compare
    return step, export, engine.close


def gloo(a):
    import torch.distributed as dist
    rank, world = torch_peers.rank_env()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    # a file rendezvous: no port to pick
    dist.init_process_group("gloo", init_method=f"file://{a.rendezvous}", rank=rank, world_size=world)
    return dist


def fsdp2_setup(a, cfg, mode, marks):
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    dist = gloo(a)
    torch_peers.PHASE[0] = "building on the meta device and sharding"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its inv_freq is a buffer computed at construction
    torch_peers.PHASE[0] = "initialising the shards"
    with torch.no_grad():
        model.apply(model._init_weights)
    if mode == "fsdp2-dcp":
        import torch.distributed.checkpoint as dcp
        torch_peers.PHASE[0] = "loading the checkpoint (DCP)"
        t = time.perf_counter()
        dcp.load(model.state_dict(), storage_reader=dcp.HuggingFaceStorageReader(a.ckpt_dir))
        marks["load_s"] = time.perf_counter() - t
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(x):
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def export(path):
        import torch.distributed.checkpoint as dcp
        dcp.save(model.state_dict(), storage_writer=dcp.HuggingFaceStorageWriter(path, save_distributed=True))

    return step, export, dist.destroy_process_group


def deepspeed_setup(a, cfg, mode, marks):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist = gloo(a)
    import deepspeed
    from transformers import LlamaForCausalLM
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    nvme = os.path.join(a.nvme_path, f"ds-{torch_peers.rank_env()[0]}")
    os.makedirs(nvme, exist_ok=True)
    largest = a.vocab * a.hidden
    ds = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
          "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},  # no cpu_adam op to build
          "zero_optimization": {"stage": 3, "sub_group_size": 10**7, "reduce_bucket_size": largest,
                                "stage3_max_live_parameters": largest, "stage3_prefetch_bucket_size": largest // 4,
                                "stage3_param_persistence_threshold": 10 * a.hidden,
                                "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False,
                                                  "buffer_count": 5, "buffer_size": largest, "max_in_cpu": 0},
                                "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False,
                                                      "buffer_count": 4}},
          "aio": {"block_size": 1 << 20, "queue_depth": 32, "intra_op_parallelism": 1, "single_submit": False,
                  "overlap_events": True}}
    torch_peers.PHASE[0] = "building under zero.Init"
    with deepspeed.zero.Init(config_dict_or_path=ds):
        model = LlamaForCausalLM(cfg)
    torch_peers.PHASE[0] = "deepspeed.initialize"
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)

    def step(x):
        loss = engine(x, labels=x).loss
        engine.backward(loss)
        engine.step()
        return loss

    def export(path):
        engine.save_16bit_model(path)

    return step, export, dist.destroy_process_group


def worker(a):
    rank, world = torch_peers.rank_env()
    torch_peers.rss_watchdog(a.rss_limit_mib)
    import torch
    from transformers.utils import logging as hf_logging
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = llama_config(a)
    t0 = time.perf_counter()
    marks = {}
    setup = {"strata": strata_setup, "fsdp2": fsdp2_setup, "deepspeed": deepspeed_setup}[a.worker.split("-")[0]]
    step, export, close = setup(a, cfg, a.worker, marks)
    marks["setup_s"] = time.perf_counter() - t0
    losses = []
    step_s = 0.0
    for s in range(a.steps):
        torch_peers.PHASE[0] = f"training step {s}"
        t = time.perf_counter()
        losses.append(step(torch_peers.batch(a, s, rank, a.vocab)).item())
        step_s = time.perf_counter() - t
        if s == 0:
            marks["first_step_s"] = time.perf_counter() - t0
    marks["steps_s"] = time.perf_counter() - t0 - marks["first_step_s"]
    if a.save_compare and "run" in SAVE_COMPARE:
        SAVE_COMPARE["run"](marks, torch_peers.batch(a, a.steps, rank, a.vocab), step_s)
    torch_peers.PHASE[0] = "export"
    t = time.perf_counter()
    export(os.path.join(a.nvme_path, f"export-{a.worker}"))
    marks["export_s"] = time.perf_counter() - t
    close()
    # the peak of the whole run (a Strata rank's VmHWM was reset before its creation replay: probe_creation)
    marks.update(rank=rank, world=world, losses=losses,
                 vmhwm_mib=max(torch_peers.status_mib("VmHWM"), marks.get("finalized_hwm_mib", 0)))
    print("RESULT " + json.dumps(marks), flush=True)


# ---------------------------------------------------------------- the driver
def write_checkpoint(a):
    """The model's tensors in HF's sharded layout, one tensor at a time (the driver never holds the model)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM
    cfg = llama_config(a)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in LlamaForCausalLM(cfg).state_dict().items()}
    os.makedirs(a.ckpt_dir, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    files, index, part, size, limit = [], {}, {}, 0, 1 << 30

    def flush():
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(part, os.path.join(a.ckpt_dir, name), metadata={"format": "pt"})
        files.append(name)
        index.update({k: name for k in part})
        part.clear()

    for n, shape in shapes.items():
        part[n] = (torch.randn(shape, generator=g) * 0.02).to(torch.float32)
        size += part[n].numel() * 4
        if sum(t.numel() * 4 for t in part.values()) >= limit:
            flush()
    if part:
        flush()
    with open(os.path.join(a.ckpt_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": index}, f)
    cfg.save_pretrained(a.ckpt_dir)


def fio_read_mb_s(a):
    files = sorted(glob.glob(os.path.join(a.ckpt_dir, "*.safetensors")))
    # fio refuses a block larger than a file: a tiny shape's checkpoint reads in 4 KiB blocks
    bs = "1M" if min(os.path.getsize(f) for f in files) >= (1 << 20) else "4k"
    cmd = ["fio", "--name=ckpt", "--rw=read", f"--bs={bs}", "--direct=1", "--ioengine=io_uring", "--numjobs=4",
           "--group_reporting", "--output-format=json", "--filename=" + ":".join(files)]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return out["jobs"][0]["read"]["bw_bytes"] / 1e6


def drop_cached(a):
    """The checkpoint's pages out of the page cache, so each load reads the disk as fio did."""
    for name in glob.glob(os.path.join(a.ckpt_dir, "*.safetensors")):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def launch(a, mode):
    for d in glob.glob(os.path.join(a.nvme_path, "*")):
        shutil.rmtree(d, ignore_errors=True)
    drop_cached(a)
    rendezvous = tempfile.mktemp(prefix="strata-bench-rdzv-")
    cmd = [os.path.join(ROOT, "scripts/mpirun_local"), "-n", str(a.ranks), sys.executable, os.path.abspath(__file__),
           "--worker", mode, "--rendezvous", rendezvous] + [f"--{k.replace('_', '-')}={v}" for k, v in (
               ("layers", a.layers), ("hidden", a.hidden), ("ffn", a.ffn), ("heads", a.heads),
               ("kv_heads", a.kv_heads), ("vocab", a.vocab), ("seq", a.seq), ("micro_batch", a.micro_batch),
               ("steps", a.steps), ("rss_limit_mib", a.rss_limit_mib), ("nvme_path", a.nvme_path),
               ("ckpt_dir", a.ckpt_dir), ("steps_over_save", a.steps_over_save),
               ("strata_offload", a.strata_offload), ("async_saves", a.async_saves))] + (
                   ["--save-compare"] if a.save_compare else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false")
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    ranks = sorted(torch_peers.results_in(text), key=lambda r: r["rank"])
    res = {"mode": mode, "rc": rc, "wall_s": time.time() - t, "ranks": ranks}
    over = [json.loads(l[len("RSSLIMIT "):]) for l in text.splitlines() if l.startswith("RSSLIMIT ")]
    res["probes"] = torch_peers.results_in(text, "PROBE ")
    if a.results:  # the job's whole output beside the results
        with open(a.results + ".log", "a") as f:
            f.write(f"==== {mode}\n{text}\n")
    if over:
        res["over_limit"] = over
    if len(ranks) != a.ranks:
        res["error"] = "\n".join(text.splitlines()[-30:])
    return res


def row(r, floor_s):
    if "error" in r:
        why = (f"over {r['over_limit'][0]['limit_mib']} MiB while {r['over_limit'][0]['phase']}"
               if "over_limit" in r else f"failed (rc {r['rc']})")
        return f"| {r['mode']} | {why} | | | | |"
    rk = r["ranks"]
    load = max((x.get("load_s", 0) for x in rk), default=0)
    load_txt = f"{load:.1f} ({load / floor_s:.1f}x floor)" if load else "-"
    return (f"| {r['mode']} | {max(x['vmhwm_mib'] for x in rk):.0f} | {max(x['first_step_s'] for x in rk):.1f} "
            f"| {load_txt} | {max(x['steps_s'] for x in rk) / max(1, len(rk[0]['losses']) - 1):.1f} "
            f"| {max(x['export_s'] for x in rk):.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-ops", action="store_true", help="JIT-compile DeepSpeed's async_io op and exit")
    p.add_argument("--worker")
    p.add_argument("--rendezvous")
    p.add_argument("--peers", default="strata-created,strata-loaded,strata-pretrained,fsdp2-meta,fsdp2-dcp,"
                                      "deepspeed-init")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rss-limit-mib", type=int, default=3072)
    p.add_argument("--nvme-path")
    p.add_argument("--ckpt-dir")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--results", help="append each candidate's result here (JSON lines)")
    p.add_argument("--save-compare", action="store_true",
                   help="Strata candidates: a synchronous and an asynchronous save of the same state after the steps")
    p.add_argument("--async-saves", type=int, default=1,
                   help="with --save-compare: asynchronous saves of the same state, each with its steps over it; "
                        "the second and later after a step without a save, reusing the snapshot's buffers")
    p.add_argument("--strata-offload", choices=("nvme", "cpu"), default="nvme",
                   help="where Strata keeps its parameter and optimizer shards: NVMe under --nvme-path, or host "
                        "memory (cpu, DeepSpeed's name); checkpoints and exports still go under --nvme-path")
    p.add_argument("--steps-over-save", type=int, default=1,
                   help="with --save-compare: the steps taken while the asynchronous save is written, before its "
                        "wait (each measured against the step before the save)")
    a = p.parse_args()
    if a.build_ops:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.accelerator import get_accelerator
        return get_accelerator().create_op_builder("AsyncIOBuilder").load()
    if a.worker:
        return worker(a)
    if not a.nvme_path or not a.ckpt_dir:
        p.error("give --nvme-path (a directory on the disk to offload to) and --ckpt-dir (the checkpoint's)")
    os.makedirs(a.nvme_path, exist_ok=True)
    if not os.path.exists(os.path.join(a.ckpt_dir, "model.safetensors.index.json")):
        write_checkpoint(a)
    ckpt_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(a.ckpt_dir, "*.safetensors")))
    fio = fio_read_mb_s(a)
    floor_s = ckpt_bytes / 1e6 / fio  # the ranks read disjoint parts, together the checkpoint once
    print(f"checkpoint {ckpt_bytes / 1e9:.2f} GB; fio sequential read {fio:.0f} MB/s: the load's floor {floor_s:.1f} s")
    results = []
    for mode in a.peers.split(","):
        r = launch(a, mode)
        results.append(r)
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(dict(r, fio_mb_s=fio, ckpt_bytes=ckpt_bytes)) + "\n")
        print(row(r, floor_s), flush=True)
        if "error" in r:
            print(r["error"], flush=True)
    print(f"\n{a.ranks} ranks, RSS limit {a.rss_limit_mib} MiB per rank, fp32 {ckpt_bytes / 1e9:.2f} GB\n"
          "| system | peak RSS MiB (max rank) | first step s | load s | later steps s | export s |\n"
          "|---|---|---|---|---|---|")
    for r in results:
        print(row(r, floor_s))
    compared = [r for r in results if "error" not in r and "sync_save_s" in r["ranks"][0]]
    if compared:
        print("\n| system | sync save s | async call s | async steps s (step before) | async wait s | async stall s "
              "| stall / sync | async RSS growth MiB |\n|---|---|---|---|---|---|---|---|")
        for r in compared:
            rk = r["ranks"]
            sync, stall = max(x["sync_save_s"] for x in rk), max(x["async_stall_s"] for x in rk)
            print(f"| {r['mode']} | {sync:.2f} | {max(x['async_call_s'] for x in rk):.3f} "
                  f"| {max(x['async_step_s'] for x in rk):.2f} ({max(x['step_before_s'] for x in rk):.2f}) "
                  f"| {max(x['async_wait_s'] for x in rk):.2f} "
                  f"| {stall:.2f} | {stall / sync:.2f} | {max(x['async_rss_growth_mib'] for x in rk):.1f} |")
        if a.async_saves > 1:
            print("\n| system | async save | call s | steps s (step before) | wait s | stall s | stall / sync "
                  "| RSS growth MiB | shared % |\n|---|---|---|---|---|---|---|---|---|")
            for r in compared:
                rk = r["ranks"]
                sync = max(x["sync_save_s"] for x in rk)
                for i in range(len(rk[0]["async_runs"])):
                    runs = [x["async_runs"][i] for x in rk]
                    stall = max(v["stall_s"] for v in runs)
                    print(f"| {r['mode']} | {i + 1} | {max(v['call_s'] for v in runs):.3f} "
                          f"| {max(v['step_s'] for v in runs):.2f} ({max(v['step_before_s'] for v in runs):.2f}) "
                          f"| {max(v['wait_s'] for v in runs):.2f} | {stall:.2f} | {stall / sync:.2f} "
                          f"| {max(v['rss_growth_mib'] for v in runs):.1f} "
                          f"| {100 * min(v['shared_bytes'] / max(v['file_bytes'], 1) for v in runs):.0f} |")


if __name__ == "__main__":
    main()
