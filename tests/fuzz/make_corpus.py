#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers: tests/fuzz/corpus/<fuzzer>/<seed>.

A handful of small inputs per format: valid ones in the layouts strata writes (so that the fuzzers start
past the magic numbers and checksums), and edge cases next to each check (a newer version, a wrong
type, a length past the end, ...). Inputs that fail today belong in tests/fuzz/regressions/, not here:
libFuzzer stops at the first seed that crashes. Deterministic: re-running it reproduces the
committed files byte for byte. Usage: tests/fuzz/make_corpus.py  (from anywhere).
"""
import json
import os
import random
import shutil
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(fuzzer, name, data):
    d = os.path.join(ROOT, fuzzer)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def dump(obj):
    return json.dumps(obj, indent=1)


def manifest(world=1, **over):
    m = {"format": "strata-checkpoint", "version": 1, "step": 20, "world_size": world, "stage": 3,
         "param_dtype": "fp32", "optimizer": "adamw", "loss_scale": 1.0, "clean_steps": 0,
         "units": [{"name": "block0", "params": [
             {"name": "w", "shape": [4, 8], "offset": 0, "numel": 32, "weight_decay": True},
             {"name": "b", "shape": [8], "offset": 32, "numel": 8, "weight_decay": False}]}],
         "shards": [{"rank": r, "file": "shard_%05d.bin" % r, "bytes": 4416, "crc32": "0badf00d"}
                    for r in range(world)],
         "trainer": {"data_position": 1280, "model": {"layers": 2}}}
    m.update(over)
    return m


def manifests():
    write("manifest", "valid_world1.json", dump(manifest()))
    write("manifest", "valid_world2.json", dump(manifest(2, stage=2, param_dtype="bf16")))
    write("manifest", "newer_version.json", dump(manifest(version=99)))
    write("manifest", "shard_count_mismatch.json", dump(manifest(world_size=3)))
    m = manifest()
    m["shards"][0]["crc32"] = "not-hex"
    write("manifest", "bad_crc.json", dump(m))
    m = manifest()
    m["units"][0]["params"][0]["shape"] = [-1, 9223372036854775807]
    write("manifest", "odd_shape.json", dump(m))
    write("manifest", "wrong_type.json", dump(manifest(step="20", loss_scale=1e300)))
    write("manifest", "not_object.json", "[1, 2, 3]")
    m = manifest(version=4)  # a param group's own lr and weight decay (Note [Param groups])
    m["units"][0]["params"][0].update(own_lr=0.003, own_weight_decay=0.05)
    m["units"][0]["params"][1]["own_lr"] = 0.003
    write("manifest", "own_hyper.json", dump(m))


def shard_file(ranges, pad_to=0, corrupt=False):
    """ranges: (unit, param, kind, begin, values). The layout of shard_file.cc, optionally packed tight."""
    def header(offsets, crcs):
        return json.dumps({"rank": 0, "world_size": 1, "ranges": [
            {"unit": u, "param": p, "kind": k, "begin": b, "count": len(v), "offset": o, "crc32": "%08x" % c}
            for (u, p, k, b, v), o, c in zip(ranges, offsets, crcs)]}, separators=(",", ":"))
    blobs = [struct.pack("<%df" % len(v), *v) for (_, _, _, _, v) in ranges]
    crcs = [zlib.crc32(b) for b in blobs]
    start = 16 + len(header([10 ** 6] * len(ranges), crcs))
    start = max(start, pad_to)
    offsets, o = [], start
    for b in blobs:
        offsets.append(o)
        o += len(b)
    h = header(offsets, crcs).encode()
    out = bytearray(b"STRATASH" + struct.pack("<Q", len(h)) + h)
    out += b" " * (start - len(out))
    for b in blobs:
        out += b
    if corrupt:
        out[-1] ^= 0xff
    return bytes(out)


def shards():
    r = [("block0", "w", "master", 0, [0.5, -1.0, 2.0, 3.0]), ("block0", "w", "exp_avg", 0, [0.0] * 4),
         ("block0", "b", "master", 32, [1.0, 2.0])]
    write("shard_file", "valid_tight.bin", shard_file(r))
    write("shard_file", "valid_padded.bin", shard_file(r[:1], pad_to=4096))
    write("shard_file", "bad_crc.bin", shard_file(r, corrupt=True))
    write("shard_file", "empty_ranges.bin", shard_file([]))
    good = shard_file(r)
    write("shard_file", "truncated.bin", good[:-6])
    write("shard_file", "bad_magic.bin", b"STRATASX" + good[8:])
    write("shard_file", "header_too_long.bin", good[:8] + struct.pack("<Q", 1 << 40) + good[16:])


def safetensors(tensors, metadata=None, data=b"", raw_header=None):
    if raw_header is None:
        h = dict(tensors)
        if metadata is not None:
            h["__metadata__"] = metadata
        raw_header = json.dumps(h, separators=(",", ":"))
    hb = raw_header.encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def safetensor_seeds():
    f32 = struct.pack("<6f", *range(6))
    bf16 = struct.pack("<4H", 0x3f80, 0x4000, 0xbf80, 0x7f80)
    f16 = struct.pack("<2H", 0x3c00, 0xfc00)
    data = f32 + bf16 + f16
    ok = {"wte.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "ln.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
          "h.0.b": {"dtype": "F16", "shape": [2], "data_offsets": [32, 36]}}
    write("safetensors", "valid.safetensors", safetensors(ok, {"format": "pt"}, data))
    write("safetensors", "empty.safetensors", safetensors({}))
    write("safetensors", "int64.safetensors",
          safetensors({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, data=b"\x01" * 8))
    write("safetensors", "overlap.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, data=bytes(12)))
    write("safetensors", "past_end.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, data=bytes(8)))
    write("safetensors", "bad_dtype.safetensors", safetensors(
        {"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, data=b"\0"))
    write("safetensors", "header_len_huge.safetensors", struct.pack("<Q", 1 << 63) + b"{}")
    write("safetensors", "not_object.safetensors", safetensors(None, raw_header="[1,2]"))
    write("safetensors", "gap.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
         "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, data=bytes(12)))
    write("safetensors", "trailing.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, data=bytes(8)))


def safetensors_index_seeds():
    def index(weight_map, **extra):
        return json.dumps(dict(extra, weight_map=weight_map), indent=2).encode()
    write("safetensors_index", "valid.json", index(
        {"transformer.wte.weight": "model-00001-of-00002.safetensors",
         "transformer.h.0.ln_1.bias": "model-00002-of-00002.safetensors"}, metadata={"total_size": 1234}))
    write("safetensors_index", "escape.json", index({"a": "../model.safetensors"}))
    write("safetensors_index", "absolute.json", index({"a": "/etc/passwd"}))
    write("safetensors_index", "not_string.json", index({"a": 3}))
    write("safetensors_index", "empty_map.json", index({}))
    write("safetensors_index", "duplicate.json", b'{"weight_map": {"a": "x", "a": "y"}}')
    write("safetensors_index", "control.json", b'{"weight_map": {"a": "x\\u0001y"}}')


def configs():
    full = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1}},
            "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100,
                                                               "warmup_min_ratio": 0, "cos_min_ratio": 0.1}},
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x"},
                                  "offload_param": {"device": "cpu", "pin_memory": True}},
            "strata": {"param_dtype": "bf16", "max_live_units": 3, "prefetch_depth": 2,
                       "device_budget": "512MiB", "host_budget": 1073741824, "seed": 7}}
    write("config", "full.json", dump(full))
    write("config", "empty_object.json", "{}")
    write("config", "fp16.json", dump({"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 100,
                                                "min_loss_scale": 1}, "optimizer": {"type": "SGD",
                                                "params": {"lr": 0.1, "momentum": 0.9}},
                                       "scheduler": {"type": "WarmupDecayLR", "params": {
                                           "warmup_num_steps": 5, "total_num_steps": 50}}}))
    write("config", "typo_key.json", '{"zero_optimisation": {"stage": 2}}')
    write("config", "duplicate_key.json", '{"strata": {"seed": 1, "seed": 2}}')
    write("config", "integral_float.json", '{"train_batch_size": 1e5, "strata": {"collective_timeout_ms": 3.5}}')
    write("config", "overrides.txt", '{"zero_optimization": {"stage": 1}}\0zero_optimization.stage=3\n'
                                     'strata.device_budget=2GiB\noptimizer.params.betas=[0.9,0.99]\n'
                                     'bf16.enabled=true\n')
    write("config", "bad_overrides.txt", '\0zero_optimization..stage=2\nstage\nstrata=3\nstrata.seed=1\n')
    # DeepSpeed configs as Hugging Face writes them ("auto", no-effect keys) and one with a problem of every
    # kind (decision 0028); the real ones are tests/configs/deepspeed.
    write("config", "deepspeed_auto.json", dump({
        "fp16": {"enabled": "auto", "loss_scale": 0, "hysteresis": 2, "consecutive_hysteresis": False},
        "optimizer": {"type": "Adam", "params": {"lr": "auto", "betas": "auto", "adam_w_mode": False}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": 10, "total_num_steps": "auto",
                                                          "warmup_type": "log"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "overlap_comm": True, "zero_quantized_weights": False},
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4,
        "steps_per_print": 100, "wall_clock_breakdown": False, "strata": {"weight_decay_1d": False}}))
    write("config", "deepspeed_problems.json", dump({
        "bfloat16": {"enabled": True}, "activation_checkpointing": {"partition_activations": True},
        "zero_optimization": {"stage": "3", "zero_hpz_partition_size": 8, "zero_quantized_gradients": True,
                              "offload_param": {"device": "cpu"}},
        "data_types": {"grad_accum_dtype": "bf16"}, "scheduler": {"type": "WarmupCosineLR", "params": {
            "warmup_max_lr": 1, "warmup_num_steps": "auto"}}, "train_batch_size": 10,
        "train_micro_batch_size_per_gpu": 4}))


def tokens():
    def llmc(count, toks, version=1, magic=20240520):
        header = struct.pack("<3i", magic, version, count) + bytes(1024 - 12)
        return header + struct.pack("<%dH" % len(toks), *toks)
    write("tokens", "llmc_valid.bin", llmc(8, [50256, 0, 1, 2, 300, 40000, 50255, 7]))
    write("tokens", "llmc_empty.bin", llmc(0, []))
    write("tokens", "llmc_truncated.bin", llmc(9, [1, 2, 3]))
    write("tokens", "llmc_version2.bin", llmc(2, [1, 2], version=2))
    write("tokens", "llmc_negative_count.bin", llmc(-5, [1]))
    write("tokens", "llmc_out_of_vocab.bin", llmc(2, [50257, 65535]))
    write("tokens", "text.txt", "The old sailor walked to the harbour at dawn.\n")
    write("tokens", "text_1024.txt", ("abc\xff" * 256).encode("latin-1"))


def capi_specs():
    # FuzzedDataProvider input: no structure to hand-write, so deterministic bytes of several lengths.
    rnd = random.Random(20240520)
    for n in (16, 64, 200):
        write("capi_specs", "random_%d.bin" % n, bytes(rnd.randrange(256) for _ in range(n)))
    write("capi_specs", "zeros_128.bin", bytes(128))
    write("capi_specs", "ones_128.bin", b"\xff" * 128)


# A whole report as the doctor wrote it on the 2-core build host: `OMP_NUM_THREADS=1 strata doctor --measure
# --json --ranks 2 --launcher scripts/mpirun_local --model gpt2-tiny --micro-batch 1 --comm-bytes 64KiB
# --adam-elems 65536` (every check and fact, not only the figures the reader takes).
DOCTOR_REPORT = r'''{
  "verdict": "warn",
  "counts": {
    "ok": 12,
    "warn": 1,
    "fail": 0
  },
  "checks": [
    {
      "name": "gpus",
      "verdict": "warn",
      "detail": "no GPU visible (libnvidia-ml.so.1: cannot open shared object file: No such file or directory); strata runs on the host back-end"
    },
    {
      "name": "versions",
      "verdict": "ok",
      "detail": "no NVIDIA driver, runtime 13.0, NCCL 2.28.9: nothing to match without a GPU"
    },
    {
      "name": "interconnect",
      "verdict": "ok",
      "detail": "no GPU: no pairs"
    },
    {
      "name": "pcie",
      "verdict": "ok",
      "detail": "no GPU"
    },
    {
      "name": "clocks",
      "verdict": "ok",
      "detail": "no GPU"
    },
    {
      "name": "cpu_cores",
      "verdict": "ok",
      "detail": "2 cores usable (no GPU)"
    },
    {
      "name": "host_ram",
      "verdict": "ok",
      "detail": "23.54 GiB host RAM (no GPU)"
    },
    {
      "name": "io_uring",
      "verdict": "ok",
      "detail": "io_uring_queue_init succeeded"
    },
    {
      "name": "nvme",
      "verdict": "ok",
      "detail": "not tested: no --nvme-path given and the config offloads nothing to NVMe"
    },
    {
      "name": "mpi",
      "verdict": "ok",
      "detail": "Open MPI v4.1.4; launcher /usr/bin/mpirun"
    },
    {
      "name": "launch",
      "verdict": "ok",
      "detail": "not started by torchrun (mpirun and srun: see mpi)"
    },
    {
      "name": "memlock",
      "verdict": "ok",
      "detail": "limit 8.00 MiB; nothing is offloaded, so no pinned buffers are needed"
    },
    {
      "name": "host figures",
      "verdict": "ok",
      "detail": "sgemm 23.3 GFLOP/s per rank at 2 ranks (46.6 alone; 128x128x512), update 71.65 GB/s, all-gather 0.620 / reduce-scatter 0.372 / all-reduce 2.250 GB/s, alpha 19.4 us"
    }
  ],
  "facts": {
    "nvml": {
      "loaded": false,
      "error": "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"
    },
    "cuda_visible_devices": null,
    "gpu_count": 0,
    "gpus": [],
    "topology": [],
    "nvlink": [],
    "versions": {
      "driver": "",
      "driver_cuda": 0,
      "driver_cuda_text": "not found",
      "cuda_runtime": 13000,
      "cuda_runtime_text": "13.0",
      "cuda_runtime_error": "",
      "nccl": 22809,
      "nccl_text": "2.28.9",
      "nccl_error": ""
    },
    "cpu_cores": 2,
    "host_ram_bytes": 25275973632,
    "memlock_limit_bytes": 8388608,
    "io_uring": {
      "ok": true,
      "error": ""
    },
    "nvme": {
      "path": "",
      "skipped_reason": "no --nvme-path given and the config offloads nothing to NVMe",
      "error": "",
      "direct_io": false,
      "test_bytes": 0,
      "write_bytes_per_s": 0.0,
      "read_bytes_per_s": 0.0
    },
    "mpi": {
      "built_with_mpi": true,
      "library_version": "Open MPI v4.1.4",
      "launcher_path": "/usr/bin/mpirun",
      "launcher_world_size": 0
    },
    "launch": {
      "torchrun": false,
      "rank": 0,
      "size": 1,
      "exchange": "",
      "error": "",
      "exchange_ms": -1.0,
      "rank0_host": ""
    },
    "pinned": {
      "offloaded": false,
      "pinned": false,
      "bytes_per_rank": 0,
      "breakdown": "; 842496 params over 2 ranks"
    },
    "host_figures": {
      "ranks": 2,
      "omp_num_threads": "1",
      "sgemm_shape": [
        128,
        128,
        512
      ],
      "matmul_gflops": 23.25819884904722,
      "matmul_gflops_one_rank": 46.58305082186052,
      "update_gbps": 71.65014577259475,
      "update_error": "",
      "launcher": "scripts/mpirun_local",
      "comm_bytes": 65536,
      "alpha_bytes": 4096,
      "allgather_gbps": 0.619562,
      "reduce_scatter_gbps": 0.371557,
      "allreduce_gbps": 2.24955,
      "alpha_us": 19.398861303960427,
      "comm_error": "",
      "seconds": 5.449644793
    }
  }
}
'''


def host_figures_report(**over):
    """What `strata doctor --measure --json --ranks 2` writes (doctor_report.cc), with host_figures overridden."""
    h = {"ranks": 2, "omp_num_threads": "1", "sgemm_shape": [512, 128, 512],
         "matmul_gflops": 61.5, "matmul_gflops_one_rank": 140.25, "update_gbps": 9.5, "update_error": "",
         "launcher": "/usr/bin/mpirun", "comm_bytes": 4194304, "alpha_bytes": 4096,
         "allgather_gbps": 1.75, "reduce_scatter_gbps": 0.625, "allreduce_gbps": 0.875, "alpha_us": 12.5,
         "comm_error": "", "seconds": 3.2}
    h.update(over)
    return {"verdict": "warn",
            "checks": [{"name": "host figures", "verdict": "ok", "detail": "sgemm 61.5 GFLOP/s per rank"}],
            "facts": {"cpu_cores": 2, "host_figures": h}}


def host_figures():
    write("host_figures", "doctor_report.json", DOCTOR_REPORT)
    write("host_figures", "measured_ranks2.json", dump(host_figures_report()))
    write("host_figures", "no_launcher.json", dump(host_figures_report(
        allgather_gbps=0, reduce_scatter_gbps=0, allreduce_gbps=0, alpha_us=0,
        comm_error="posix_spawnp(/nonexistent/mpirun): No such file or directory")))
    write("host_figures", "one_rank.json", dump(host_figures_report(
        ranks=1, matmul_gflops=140.25, allgather_gbps=0, reduce_scatter_gbps=0, allreduce_gbps=0, alpha_us=0,
        comm_error="one rank has no collectives (give --ranks 2 or more)")))
    write("host_figures", "wrong_types.json", dump(host_figures_report(ranks="2", update_gbps=True)))
    write("host_figures", "out_of_range.json", dump(host_figures_report(ranks=4294967298, matmul_gflops=1e300,
                                                                       alpha_us=-1)))
    r = host_figures_report()
    del r["facts"]["cpu_cores"]
    write("host_figures", "no_cpu_cores.json", dump(r))
    write("host_figures", "no_host_figures.json", dump({"verdict": "ok", "checks": [], "facts": {"cpu_cores": 2}}))
    write("host_figures", "compact.json", json.dumps(host_figures_report(), separators=(",", ":")))


if __name__ == "__main__":
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    manifests()
    shards()
    safetensor_seeds()
    safetensors_index_seeds()
    configs()
    tokens()
    capi_specs()
    host_figures()
