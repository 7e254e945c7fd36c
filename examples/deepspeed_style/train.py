"""A DeepSpeed training script that Strata runs with one changed line: `import deepspeed` became
`import strata.deepspeed as deepspeed` (tests/python/test_deepspeed_script.py checks that nothing else names
Strata). A byte-level language model on data/corpus.txt, ZeRO-3, 4 micro-batches per optimizer step,
param groups without weight decay for biases and norms, a tagged checkpoint with client state, and resume.

    scripts/mpirun_local -n 2 build/venv/bin/python examples/deepspeed_style/train.py --steps 40 --ckpt /tmp/ck
    scripts/mpirun_local -n 2 build/venv/bin/python examples/deepspeed_style/train.py --steps 60 --ckpt /tmp/ck --resume
"""
import argparse
import os

import torch
from torch import nn

import strata.deepspeed as deepspeed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ, VOCAB = 32, 256
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 10}},
    "zero_optimization": {"stage": 3},
}


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, h):
        return h + self.fc2(nn.functional.gelu(self.fc1(self.norm(h))))


class ByteLM(nn.Module):
    def __init__(self, d=64, layers=3):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, x, y):
        h = self.emb(x) + self.pos[: x.shape[1]]
        for b in self.blocks:
            h = b(h)
        logits = self.head(self.norm(h))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def build_model(seed=0):
    torch.manual_seed(seed)
    return ByteLM()


def param_groups(model, weight_decay):
    """The usual split: 2-D weights decay, biases, norms and the position table do not."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n != "pos"]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2 or n == "pos"]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def corpus():
    with open(os.path.join(ROOT, "data", "corpus.txt"), "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.long)


def batch(data, step, micro, rank, size):
    """Rank `rank`'s micro-batch `micro` of optimizer step `step`: windows drawn from a seed of the three."""
    g = torch.Generator().manual_seed(10007 * step + 101 * micro + rank)
    starts = torch.randint(0, len(data) - SEQ - 1, (size,), generator=g)
    x = torch.stack([data[s:s + SEQ] for s in starts])
    y = torch.stack([data[s + 1:s + SEQ + 1] for s in starts])
    return x, y


def main(argv=None):
    parser = argparse.ArgumentParser(description="a DeepSpeed-style training loop")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-at", type=int, default=20, help="save a checkpoint before this optimizer step")
    parser.add_argument("--ckpt", default="checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --ckpt")
    parser.add_argument("--print-every", type=int, default=10)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)

    model = build_model()
    config = None if args.deepspeed_config else CONFIG
    weight_decay = CONFIG["optimizer"]["params"]["weight_decay"]
    engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model, config=config,
                                                           model_parameters=param_groups(model, weight_decay))
    data = corpus()
    first, history = 0, {"losses": [], "lrs": []}
    if args.resume:
        path, client_state = engine.load_checkpoint(args.ckpt)
        if path is not None:
            first, history = client_state["next_step"], client_state["history"]
    for step in range(first, args.steps):
        if step == args.save_at and not args.resume:
            engine.save_checkpoint(args.ckpt, tag=f"step{step}", client_state={"next_step": step, "history": history})
        history["lrs"].append(engine.get_lr()[0])
        for micro in range(engine.gradient_accumulation_steps()):
            x, y = batch(data, step, micro, engine.global_rank, engine.train_micro_batch_size_per_gpu())
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            history["losses"].append(loss.item())
        if engine.global_rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {history['losses'][-1]:.4f}  lr {scheduler.get_last_lr()[0]:.2e}  "
                  f"global_steps {engine.global_steps}", flush=True)
    return engine, history


if __name__ == "__main__":
    main()
