#!/usr/bin/env python3
"""Writes tests/reference/gpt_fixture.safetensors: a PyTorch reference for the GPT-2 implementation.

A small GPT-2 (2 blocks, d_model 16, 2 heads, seq 8, vocab 23) written directly in PyTorch with Hugging
Face GPT-2's parameter names and Conv1D layouts ([in, out]), evaluated in float64 on a fixed batch:
  - the weights (F32, HF names),
  - inputs / targets (token ids stored as F32),
  - loss (mean cross-entropy) and every parameter's gradient ("grad.<name>"),
  - the parameters after one torch.optim.AdamW step ("adamw.<name>"), weight decay on 2-D weights only.
The C++ test (tests/models/gpt/model/gpt_reference_test.cc) reads it with no PyTorch. Run from the repo root:
    python3 tests/reference/make_gpt_fixture.py
"""
import math
import os

import torch
from safetensors.torch import save_file

L, C, NH, T, V, B = 2, 16, 2, 8, 23, 2
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def params(gen):
    p = {"wte.weight": torch.randn(V, C, generator=gen) * 0.3, "wpe.weight": torch.randn(T, C, generator=gen) * 0.2}
    for i in range(L):
        h = f"h.{i}."
        p[h + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        p[h + "ln_1.bias"] = 0.1 * torch.randn(C, generator=gen)
        p[h + "attn.c_attn.weight"] = 0.3 * torch.randn(C, 3 * C, generator=gen)
        p[h + "attn.c_attn.bias"] = 0.1 * torch.randn(3 * C, generator=gen)
        p[h + "attn.c_proj.weight"] = 0.3 * torch.randn(C, C, generator=gen)
        p[h + "attn.c_proj.bias"] = 0.1 * torch.randn(C, generator=gen)
        p[h + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        p[h + "ln_2.bias"] = 0.1 * torch.randn(C, generator=gen)
        p[h + "mlp.c_fc.weight"] = 0.3 * torch.randn(C, 4 * C, generator=gen)
        p[h + "mlp.c_fc.bias"] = 0.1 * torch.randn(4 * C, generator=gen)
        p[h + "mlp.c_proj.weight"] = 0.3 * torch.randn(4 * C, C, generator=gen)
        p[h + "mlp.c_proj.bias"] = 0.1 * torch.randn(C, generator=gen)
    p["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
    p["ln_f.bias"] = 0.1 * torch.randn(C, generator=gen)
    return p


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, idx, tgt):
    ln = torch.nn.functional.layer_norm
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"h.{i}."
        a = ln(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = ln(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        x = x + gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"]) @ p[h + "mlp.c_proj.weight"] \
            + p[h + "mlp.c_proj.bias"]
    x = ln(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].T
    return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))


def main():
    gen = torch.Generator().manual_seed(1234)
    init = params(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    p = {k: v.double().clone().requires_grad_(True) for k, v in init.items()}
    loss = forward(p, idx, tgt)
    loss.backward()
    out = {k: v.float().contiguous() for k, v in init.items()}
    out["inputs"] = idx.float()
    out["targets"] = tgt.float()
    out["loss"] = loss.detach().float().reshape(1)
    for k, v in p.items():
        out["grad." + k] = v.grad.float().contiguous()
    decay = [v for k, v in p.items() if v.dim() == 2]
    no_decay = [v for k, v in p.items() if v.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    opt.step()
    for k, v in p.items():
        out["adamw." + k] = v.detach().float().contiguous()
    meta = {"layers": str(L), "d_model": str(C), "heads": str(NH), "seq_len": str(T), "vocab": str(V),
            "batch": str(B), "lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS),
            "weight_decay": str(WD), "torch": torch.__version__}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_fixture.safetensors")
    save_file(out, path, metadata=meta)
    print(f"wrote {path}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
