"""Hugging Face GPT-2 (GPT2LMHeadModel from a GPT2Config: no download), unmodified, trained with
strata.torch on the repository's corpus (data/corpus.txt, one token per byte), ZeRO-3 by default.

    scripts/mpirun_local -n 2 build/venv/bin/python examples/torch/train_gpt2.py      (examples/torch/run does it all)

Every rank runs this file on its own micro-batches; Strata shards the parameters, gradients and AdamW
state over the ranks, gathers each GPT2Block's parameters just before it runs and reduces its gradients
right after. The torch optimizer is not used: engine.step() is the update.
"""
import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import strata.torch as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_model_args(p):
    """The model, data and run flags this example shares with lora_gpt2.py."""
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--print-every", type=int, default=25)
    p.add_argument("--checkpoint-dir", default=None, help="save a checkpoint here at the end")
    p.add_argument("--corpus", default=os.path.join(ROOT, "data", "corpus.txt"))


def args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600)
    add_model_args(p)
    return p.parse_args()


def windows(tokens, step, a):
    """This rank's micro-batch at `step`: random windows drawn from a generator seeded by the step, so
    the ranks together see one global batch, each its own slice."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, tokens.numel() - a.seq - 1, (st.world_size(), a.micro_batch), generator=g)[st.rank()]
    return torch.stack([tokens[s:s + a.seq] for s in starts.tolist()])


@torch.no_grad()
def sample(model, prompt, n):
    """Greedy continuation. Evaluation forwards gather on demand; at stage 3 every rank must run them."""
    ids = torch.tensor([list(prompt.encode())])
    for _ in range(n):
        logits = model(ids[:, -model.config.n_positions:]).logits
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    return bytes(ids[0].tolist()).decode(errors="replace")


def main():
    a = args()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    tokens = torch.tensor(list(open(a.corpus, "rb").read()), dtype=torch.long)
    torch.manual_seed(0)  # rank 0's initial values are every rank's anyway
    cfg = GPT2Config(vocab_size=256, n_positions=a.seq, n_embd=a.embd, n_layer=a.layers, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    engine = st.shard(model, {
        "zero_optimization": {"stage": a.stage},
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.1, "betas": [0.9, 0.95]}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"warmup_num_steps": min(30, a.steps // 10), "total_num_steps": a.steps,
                                 "cos_min_ratio": 0.1}},
        "strata": {"optimizer_threads": 1, "weight_decay_1d": False}})  # GPT-2's rule: no decay on biases, norms
    if st.rank() == 0:
        print(f"GPT2LMHeadModel {n_params / 1e6:.2f}M parameters, {len(engine.units)} units, "
              f"{st.world_size()} ranks, ZeRO-{a.stage}, {a.steps} steps of {st.world_size() * a.micro_batch} "
              f"x {a.seq} bytes", flush=True)
    model.train()
    t0 = time.time()
    for step in range(a.steps):
        x = windows(tokens, step, a)
        loss = model(x, labels=x).loss
        loss.backward()
        r = engine.step()
        if step % a.print_every == 0 or step == a.steps - 1:
            mean = st.all_reduce_mean(loss.item())
            if st.rank() == 0:
                print(f"step {step:4d}  loss {mean:.4f}  grad norm {r['grad_norm']:.3f}  lr {r['lr']:.2e}  "
                      f"{time.time() - t0:.0f}s", flush=True)
    stats = engine.stats()
    if a.checkpoint_dir:
        engine.save_checkpoint(a.checkpoint_dir, {"steps": a.steps})
    model.eval()
    text = sample(model, "The ferryman ", 80)
    if st.rank() == 0:
        print(f"peak engine memory per rank {stats['device_peak_bytes'] / 2**20:.1f} MiB; sample:\n{text}")
    engine.close()


if __name__ == "__main__":
    main()
