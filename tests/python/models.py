"""Tiny models and data for the strata.torch tests (every rank builds the same ones from a seed)."""
import copy

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


def hf_builders():
    """Zero-argument builders of small transformers models from their configs (no download), one per family
    strata.torch trains: the builder itself draws the initial values (the caller seeds)."""
    import transformers as T  # noqa: N812  (only the tests that use it pay for the import)
    small = dict(vocab_size=HF_VOCAB, hidden_size=HF_C, intermediate_size=2 * HF_C, num_hidden_layers=2,
                 num_attention_heads=4)
    return {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=HF_VOCAB, n_positions=16, n_embd=HF_C, n_layer=2,
                                                       n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=32)),
        "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(**small, num_key_value_heads=2, num_local_experts=4,
                                                                num_experts_per_tok=2, max_position_embeddings=32)),
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(**small, max_position_embeddings=32)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(vocab_size=HF_VOCAB, d_model=HF_C, d_kv=8,
                                                              d_ff=2 * HF_C, num_layers=2, num_heads=4)),
        "bart": lambda: T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=HF_VOCAB, d_model=HF_C, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=2 * HF_C, decoder_ffn_dim=2 * HF_C, max_position_embeddings=32)),
        "vit": lambda: T.ViTForImageClassification(T.ViTConfig(image_size=16, patch_size=4, hidden_size=HF_C,
                                                               intermediate_size=2 * HF_C, num_hidden_layers=2,
                                                               num_attention_heads=2, num_labels=3)),
    }


class InitZoo(nn.Module):
    """A plain torch model whose construction uses torch's initialisations and modules with reset_parameters
    (Embedding with padding, Conv2d, BatchNorm, MultiheadAttention, LSTM), values read while it is built
    (item(), any()), a parameter copied from another, a user generator, deepcopy and buffers made from data."""

    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(50, d, padding_idx=3)
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm1d(d)
        self.mha = nn.MultiheadAttention(d, 2)
        self.lstm = nn.LSTM(d, d)
        g = torch.Generator().manual_seed(7)
        self.inits = nn.ParameterList(nn.Parameter(torch.empty(20, 30)) for _ in range(6))
        nn.init.orthogonal_(self.inits[0])
        nn.init.trunc_normal_(self.inits[1], std=0.02)
        nn.init.xavier_normal_(self.inits[2])
        nn.init.sparse_(self.inits[3], 0.5)
        nn.init.eye_(self.inits[4])
        nn.init.normal_(self.inits[5], generator=g)
        self.dirac = nn.Parameter(torch.empty(4, 4, 3))
        nn.init.dirac_(self.dirac)
        self.scaled = nn.Parameter(torch.randn(8, d) * 0.1)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)))
        self.register_buffer("idx", torch.arange(10).expand(1, -1), persistent=False)
        self.rates = [v.item() for v in torch.linspace(0, 1, 5)]
        self.filled = nn.Parameter(torch.full((5,), self.rates[2]))
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.blocks.append(copy.deepcopy(self.blocks[0]))
        with torch.no_grad():
            self.blocks[0].fc1.weight[0].fill_(1.0)
            self.blocks[0].fc1.weight.mul_(2)
            if (self.blocks[0].fc1.bias > 0).any():
                self.blocks[0].fc1.bias.add_(1)
            self.blocks[1].fc2.weight.copy_(self.blocks[0].fc1.weight.t())
