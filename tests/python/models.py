"""Tiny models and data for the strata.torch tests (every rank builds the same ones from a seed)."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding, blocks, final norm and an LM head tied to the embedding (one parameter)."""

    def __init__(self, vocab=37, d=16, layers=3, ckpt=None, order=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(8, d) * 0.1)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.ckpt = ckpt  # None, "reentrant" or "non-reentrant": torch.utils.checkpoint on each block
        self.order = order or list(range(layers))  # the blocks run in this order (one may run twice)

    def forward(self, x, labels):
        h = self.emb(x) + self.pos[: x.shape[1]]
        for b in (self.blocks[i] for i in self.order):
            if self.ckpt is None:
                h = b(h)
            else:
                h = checkpoint(b, h, use_reentrant=self.ckpt == "reentrant")
        logits = self.head(self.norm(h))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def seeded(build, seed=0, bias_std=0.1):
    """build() under `seed`, with every parameter drawn at random, norms' biases too: a tensor that starts at
    zero has a norm of about lr x steps after training, so fp32 rounding of its Adam updates would dominate
    its relative error."""
    torch.manual_seed(seed)
    m = build()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, bias_std)
    return m


HF_VOCAB, HF_T, HF_C = 64, 12, 32  # the tests' Hugging Face GPT-2: vocabulary, sequence length, width


def hf_gpt2(seed=0):
    """A small transformers GPT2LMHeadModel built from its config (no download), random biases (seeded)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # only the tests that use it pay for the import
    cfg = GPT2Config(vocab_size=HF_VOCAB, n_positions=16, n_embd=HF_C, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return seeded(lambda: GPT2LMHeadModel(cfg), seed, bias_std=0.05)


def hf_gpt2_batch(step, rank):
    """The token batch of `rank` at `step` for hf_gpt2: the same on every process."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, HF_VOCAB, (2, HF_T), generator=g)


def tiny_lm(seed=0, **kw):
    return seeded(lambda: TinyLM(**kw), seed)


def batches(step, micro, rank, n=2, t=8, vocab=37):
    """The (x, y) micro-batch `micro` of rank `rank` at step `step`: the same on every process."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randint(0, vocab, (n, t), generator=g)
    return x, torch.roll(x, -1, 1)
