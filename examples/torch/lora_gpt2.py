"""A LoRA-style fine-tune with strata.torch: Hugging Face GPT-2 (GPT2LMHeadModel from a GPT2Config: no
download) whose every attention and MLP projection (transformers' Conv1D) gets a low-rank adapter
x @ A @ B * (alpha / r) beside it; the base model is frozen (requires_grad=False), the adapters train.

    scripts/mpirun_local -n 2 build/venv/bin/python examples/torch/lora_gpt2.py   (examples/torch/run lora does it all)

Frozen parameters are Strata's frozen units: gathered for the forward and the backward (the input
gradients need them), never reduced or updated, with no gradient or optimizer memory, and checkpointed.
Each GPT2Block holds both kinds, so it is two engine units, hooked together. With no pretrained weights
to download, the frozen base is first trained for --base-steps steps on the first half of the corpus
(the "pretraining", ZeRO-3 over the same ranks), then frozen and adapted to the second half.
"""
import argparse
import math
import time

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D
from transformers.utils import logging as hf_logging

import strata.torch as st
from train_gpt2 import add_model_args, windows  # this directory is on sys.path when run as a script


def args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-steps", type=int, default=150, help="steps of the base model before freezing it")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps of the adapters")
    p.add_argument("--rank", type=int, default=8, help="the adapters' rank r")
    p.add_argument("--alpha", type=float, default=16.0)
    add_model_args(p)  # --stage, --seq, --micro-batch, --layers, --embd, --lr, --print-every, ...
    return p.parse_args()


class LoRA(nn.Module):
    """base(x) + x @ A @ B * (alpha / r). B starts at zero, so the adapted model starts as the base."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape  # Conv1D keeps its weight as [in, out]: y = x @ W + b
        self.lora_a = nn.Parameter(torch.randn(n_in, rank) / math.sqrt(n_in))
        self.lora_b = nn.Parameter(torch.zeros(rank, n_out))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a @ self.lora_b) * self.scale


def add_adapters(model, rank, alpha):
    """Freezes every parameter of `model`, then wraps each Conv1D of its blocks in a LoRA adapter."""
    model.requires_grad_(False)
    for block in model.transformer.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, Conv1D):
                    setattr(parent, name, LoRA(child, rank, alpha))


def config(a, steps, weight_decay):
    return {"zero_optimization": {"stage": a.stage}, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": weight_decay, "betas": [0.9, 0.95]}},
            "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": min(20, steps // 10),
                                                               "total_num_steps": max(steps, 1), "cos_min_ratio": 0.1}},
            "strata": {"optimizer_threads": 1, "weight_decay_1d": False}}


def train(model, engine, tokens, steps, a, what):
    t0 = time.time()
    for step in range(steps):
        x = windows(tokens, step, a)
        loss = model(x, labels=x).loss
        loss.backward()
        r = engine.step()
        if step % a.print_every == 0 or step == steps - 1:
            mean = st.all_reduce_mean(loss.item())
            if st.rank() == 0:
                print(f"{what} step {step:4d}  loss {mean:.4f}  grad norm {r['grad_norm']:.3f}  lr {r['lr']:.2e}  "
                      f"{time.time() - t0:.0f}s", flush=True)


@torch.no_grad()
def mean_loss(model, tokens, a, batches=4):
    """The loss over a few fixed windows of `tokens` (an evaluation: every rank runs it)."""
    total = 0.0
    for b in range(batches):
        x = windows(tokens, 10_000 + b, a)
        total += model(x, labels=x).loss.item()
    return st.all_reduce_mean(total / batches)


def main():
    a = args()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    data = torch.tensor(list(open(a.corpus, "rb").read()), dtype=torch.long)
    base_tokens, tune_tokens = data[: data.numel() // 2], data[data.numel() // 2:]
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=a.seq, n_embd=a.embd, n_layer=a.layers, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)

    # 1. The base, trained as a whole (what a download would give), then taken back as plain tensors.
    engine = st.shard(model, config(a, a.base_steps, 0.1))
    train(model, engine, base_tokens, a.base_steps, a, "base")
    base_state = engine.full_state_dict()
    engine.close()
    model = GPT2LMHeadModel(cfg)
    model.load_state_dict(base_state)

    # 2. The fine-tune: base frozen, adapters trained (no weight decay on them, as is usual for LoRA).
    add_adapters(model, a.rank, a.alpha)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    engine = st.shard(model, config(a, a.steps, 0.0))
    stats = engine.stats()
    if st.rank() == 0:
        kinds = sum(u.spec.frozen for u in engine.units)
        print(f"LoRA r={a.rank}: {trainable / 1e3:.1f}k trainable and {frozen / 1e6:.2f}M frozen parameters in "
              f"{len(engine.units)} units ({kinds} frozen), {st.world_size()} ranks, ZeRO-{a.stage}; engine memory "
              f"per rank {stats['device_current_bytes'] / 2**20:.2f} MiB", flush=True)
    before = mean_loss(model, tune_tokens, a)
    if st.rank() == 0:
        print(f"held-out loss on the fine-tuning text before: {before:.4f}", flush=True)
    train(model, engine, tune_tokens, a.steps, a, "lora")
    after = mean_loss(model, tune_tokens, a)
    state = engine.full_state_dict()
    # The base's tensors are "<module>.base.<name>" inside the adapters, "<module>.<name>" before.
    unchanged = all(torch.equal(v, base_state[k.replace(".base.", ".")]) for k, v in state.items() if "lora_" not in k)
    if a.checkpoint_dir:
        engine.save_checkpoint(a.checkpoint_dir, {"steps": a.steps})
    if st.rank() == 0:
        print(f"held-out loss on the fine-tuning text after: {after:.4f}; base weights bit for bit unchanged: "
              f"{unchanged}", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
