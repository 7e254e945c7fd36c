"""The host memory an asynchronous checkpoint holds for a LoRA adapter over a large frozen base (Note [Frozen
units in a snapshot], runtime/engine/unit_storage.cc; docs/decisions/0050-frozen-units-held-in-place.md).

A Llama built from its config (HF transformers), created sharded with peft's LoRA inside the factory (the base
frozen, the adapters trainable), ZeRO stage 3 in host memory. After 3 steps: a synchronous save, then an
asynchronous one of the same state with 2 steps taken while it is written. Each rank prints one JSON line: the
model's frozen and trainable parameter counts, the synchronous save's seconds, the asynchronous call's seconds, and
the growth of its resident set from before the asynchronous call to the most it reached while the save was in
flight (VmRSS sampled every 2 ms by a thread), beside the same growth over 2 steps with no save (the steps'
own churn).

    scripts/mpirun_local -n 2 build/venv/bin/python benchmarks/lora_async_save_bench.py --dir DIR
    STRATA_LIBRARY=<another build>/lib/libstrata.so ... (the same script against another library)

With --nvme DIR the parameter shards and the optimizer state live on NVMe files there (offload_param and
offload_optimizer "nvme"), where the save holds the frozen shards' extents
(docs/decisions/0052-frozen-nvme-shards-held.md).
"""
import argparse
import json
import os
import shutil
import threading
import time

import torch


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """The most VmRSS reached while it runs, sampled every 2 ms."""

    def __init__(self):
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def stop(self):
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, help="where the checkpoints go (emptied first by rank 0)")
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--rank-lora", type=int, default=8)
    p.add_argument("--nvme", help="parameter shards and optimizer state on NVMe files in this directory")
    a = p.parse_args()

    import peft
    import strata.torch as st
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.hidden // 128, num_key_value_heads=a.hidden // 128,
                      vocab_size=a.vocab, max_position_embeddings=a.seq)

    def build():
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg)
        return peft.get_peft_model(m, peft.LoraConfig(r=a.rank_lora, target_modules=["q_proj", "v_proj"]))

    config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "strata": {"optimizer_threads": 1}}
    if a.nvme:
        for key in ("offload_param", "offload_optimizer"):
            config["zero_optimization"][key] = {"device": "nvme", "nvme_path": a.nvme, "pin_memory": False}
    engine = st.shard(build, config)
    model = engine.model
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    if rank == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
    torch.manual_seed(1 + rank)
    x = torch.randint(0, a.vocab, (1, a.seq))

    def step():
        model(x, labels=x).loss.backward()
        engine.step()

    for _ in range(3):
        step()
    with torch.device("meta"):  # the counts of the whole model (the sharded one holds no full parameters)
        whole = build()
    frozen = sum(p.numel() for p in whole.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in whole.parameters() if p.requires_grad)
    del whole
    out = {"rank": rank, "library": os.environ.get("STRATA_LIBRARY", "installed"),
           "model_frozen_params": frozen, "model_trainable_params": trainable}

    base = rss_bytes()  # the steps' own churn, no save
    peak = PeakRss()
    step()
    step()
    out["steps_rss_growth_mib"] = (peak.stop() - base) / 2**20

    t = time.perf_counter()
    engine.save_checkpoint(os.path.join(a.dir, "sync"))
    out["sync_save_s"] = time.perf_counter() - t

    base = rss_bytes()
    peak = PeakRss()
    t = time.perf_counter()
    engine.save_checkpoint(os.path.join(a.dir, "async"), async_save=True)
    out["async_call_s"] = time.perf_counter() - t
    step()
    step()
    engine.wait_checkpoint()
    out["async_total_s"] = time.perf_counter() - t
    out["async_rss_growth_mib"] = (peak.stop() - base) / 2**20
    print("result " + json.dumps(out), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
