"""engine.load_pretrained (docs/decisions/0037-pretrained-by-byte-ranges.md) against the disk's sequential read
bandwidth, measured by fio on the same file in the same run.

    scripts/mpirun_local -n 1 build/venv/bin/python benchmarks/peers/pretrained_load_bench.py --mib 512
    scripts/mpirun_local -n 2 build/venv/bin/python benchmarks/peers/pretrained_load_bench.py --mib 512
    scripts/mpirun_local -n 2 build/venv/bin/python benchmarks/peers/pretrained_load_bench.py \
        --hf-dir /tmp/llama-ckpt --nvme /work/bench/nvme-load --rounds 2 --hot 0

With --hf-dir, the checkpoint is that Hugging Face directory (config.json and its safetensors, as save_pretrained
writes them) and the model is AutoModelForCausalLM.from_config of its config. With --nvme, parameters and
optimizer state are offloaded to NVMe under that directory (one subdirectory per rank), and each load also
prints the bytes the engine's NVMe offload wrote and read during it (strata_load_stats.nvme_bytes_written, the
I/O queue's own count) against one pass over the rank's parameter shards and fp32 master (decision 0043).

Rank 0 writes a checkpoint of `--mib` MiB of fp32 parameters (square Linear layers, transformers' layout:
model.safetensors) under --dir. Each round, alternating: the file is dropped from the page cache
(posix_fadvise DONTNEED after an fsync: the next read comes from the disk), fio reads it sequentially once (rank
0; buffered like the loader, 1 MiB blocks, depth 32, io_uring or psync when fio lacks it, --invalidate=1); the
file is dropped again and every rank loads it into a stage-3 engine (each rank reads only its 1/world_size of
the bytes). Printed: fio's bandwidth; the load's wall time (the slowest rank, from the call to its return:
validation, reads, conversion, the writes into the shards, the ranks' agreement) and the reader's own time and
back-end; the same load three times more with the file left in the page cache (its cost besides the disk); the floor (the file's parameter bytes over fio's bandwidth: the ranks share one disk, so together they
cannot read the bytes faster); the medians over --rounds, and each round's load over that round's floor (on a
shared disk whose speed moves between rounds, the ratio of neighbours is steadier than either median).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
from torch import nn

import strata.torch as st
from strata.torch import _pretrained

DIM = 2048  # a layer of 2048 x 2048 fp32: 16 MiB


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fio_read(path):
    engines = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True).stdout
    engine = "io_uring" if "io_uring" in engines else "psync"
    size = os.path.getsize(path)
    out = subprocess.run(["fio", "--name=seqread", f"--filename={path}", "--rw=read", "--bs=1M", "--iodepth=32",
                          f"--ioengine={engine}", "--direct=0", "--invalidate=1", f"--size={size}",
                          "--output-format=json"], capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return job["bw_bytes"], engine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="fp32 parameter MiB of the checkpoint (a multiple of 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the checkpoint goes (default: a new directory in $TMPDIR)")
    ap.add_argument("--hf-dir", default=None, help="load this Hugging Face checkpoint directory instead")
    ap.add_argument("--nvme", default=None, help="offload parameters and optimizer state to NVMe here")
    ap.add_argument("--hot", type=int, default=3, help="loads with the checkpoint in the page cache")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.hf_dir:
        import glob
        from transformers import AutoConfig, AutoModelForCausalLM
        path = base = args.hf_dir
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        hf_config = AutoConfig.from_pretrained(path)

        def factory():
            return AutoModelForCausalLM.from_config(hf_config)
        nbytes = sum(os.path.getsize(f) for f in files)
    else:
        layers = max(1, args.mib // 16)
        base = st.world().bcast(args.dir or tempfile.mkdtemp(prefix="strata-load-bench-"), root=0)
        path = os.path.join(base, "ckpt")

        def factory():
            return nn.Sequential(*[nn.Linear(DIM, DIM, bias=False) for _ in range(layers)])

        if st.rank() == 0:
            from safetensors.torch import save_file
            os.makedirs(path, exist_ok=True)
            save_file(factory().state_dict(), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        st.world().barrier()
        files = [os.path.join(path, "model.safetensors")]
        nbytes = layers * DIM * DIM * 4
    cfg = {"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    if args.nvme:
        nvme = os.path.join(args.nvme, f"rank{st.rank()}")
        shutil.rmtree(nvme, ignore_errors=True)
        os.makedirs(nvme)
        cfg["zero_optimization"].update(offload_param={"device": "nvme", "nvme_path": nvme},
                                        offload_optimizer={"device": "nvme", "nvme_path": nvme})
    engine = st.shard(factory, cfg)
    try:  # load_pretrained looks for transformers' renamings: its import (seconds) is not the load's cost
        from transformers import PreTrainedModel  # noqa: F401, PLC0415
        from transformers.core_model_loading import revert_weight_conversion  # noqa: F401, PLC0415
    except ImportError:
        pass
    fio_bw, walls, reader, backend, written, nvme_read = [], [], [], "", [], []
    for _ in range(args.rounds):
        if st.rank() == 0:
            fio_engine, t = "", 0
            for file in files:  # one sequential pass over the files: their bytes over fio's total time
                drop_cache(file)
                b, fio_engine = fio_read(file)
                t += os.path.getsize(file) / b
                drop_cache(file)
            fio_bw.append(sum(os.path.getsize(f) for f in files) / t)
        st.world().barrier()
        t = time.perf_counter()
        engine.load_pretrained(path)
        wall = time.perf_counter() - t
        walls.append(max(st.world().allgather(wall)))
        stats = _pretrained.last_load_stats
        reader.append(max(st.world().allgather(stats["seconds"])))
        backend = stats["backend"]
        mine = stats["bytes_read"]
        written.append(max(st.world().allgather(stats["nvme_bytes_written"])))
        nvme_read.append(max(st.world().allgather(stats["nvme_bytes_read"])))
    nvme_bytes = max(st.world().allgather(engine.stats()["nvme_current_bytes"]))
    hot = []  # the file in the page cache: what the load costs besides the disk (copies, conversion, the writes)
    for _ in range(args.hot):
        st.world().barrier()
        t = time.perf_counter()
        engine.load_pretrained(path)
        hot.append(max(st.world().allgather(time.perf_counter() - t)))
    engine.close()
    if st.rank() == 0:
        bw = statistics.median(fio_bw)
        floor = nbytes / bw
        wall, rd = statistics.median(walls), statistics.median(reader)
        # The disk is shared and its speed moves between rounds: each round's load against that round's fio.
        ratios = [w / (nbytes / b) for w, b in zip(walls, fio_bw)]
        print(f"checkpoint: {nbytes / 2**20:.0f} MiB fp32 in {path}; {st.world_size()} rank(s), each reads "
              f"{mine / 2**20:.0f} MiB ({backend})")
        print(f"fio sequential read ({fio_engine}, buffered, 1 MiB x 32, cache dropped): "
              f"{bw / 1e6:.0f} MB/s (rounds: {', '.join(f'{b / 1e6:.0f}' for b in fio_bw)})")
        print(f"floor (bytes / fio): {floor:.3f} s")
        print(f"load_pretrained wall (slowest rank): {wall:.3f} s = {wall / floor:.2f} x floor, "
              f"{nbytes / wall / 1e6:.0f} MB/s (rounds: {', '.join(f'{w:.3f}' for w in walls)})")
        print(f"  of which the reader (reads + conversion + writes into the shards): {rd:.3f} s "
              f"(rounds: {', '.join(f'{r:.3f}' for r in reader)})")
        if hot:
            print(f"the same load from the page cache (no disk): {statistics.median(hot):.3f} s median "
                  f"(rounds: {', '.join(f'{h:.3f}' for h in hot)}), {nbytes / statistics.median(hot) / 1e6:.0f} MB/s")
        if args.nvme:
            # AdamW: the master, m and v lanes are the same size, the parameter shards on top (fp32: as big)
            print(f"NVMe offload written during each load (most of any rank): "
                  f"{', '.join(f'{w / 1e9:.3f}' for w in written)} GB; read: "
                  f"{', '.join(f'{r / 1e9:.3f}' for r in nvme_read)} GB; the rank's NVMe footprint (master, m, v, "
                  f"parameter shards) {nvme_bytes / 1e9:.3f} GB")
        print(f"per round, load / (bytes / that round's fio): {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.2f}")
        if args.dir is None and not args.hf_dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
