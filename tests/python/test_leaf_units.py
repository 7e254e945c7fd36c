"""Leaf units (Note [Leaf units] in strata/torch/_units.py, docs/decisions/0040): an untied model's embedding and LM
head are units of their own, not the root's, and the gradient shards with strata.optimizer_in_backward.

- The units of an untied Llama: its embedding, final norm and LM head are units and there is no root (so 2 live
  units, not 3); a tied one keeps the embedding and the norm in the root; beside a root of the model's own
  parameters an embedding or a head smaller than a block stays in it.
- Training matches plain torch (decision 0003's measure, as test_hf_gpt2), with and without HF's gradient
  checkpointing, and is bit for bit the training with the old units (unit_classes=the decoder layer: embedding and
  head in the root), whose gradients, reductions and updates are the same per element.
- The pools are sized by the units: the engine's device-tier bytes after shard() are the two slot pools of
  decision 0019 planned over these units' sizes plus the reduce-scatter's scratch, and smaller than with the old
  root where the root dominated.
- Created sharded, trained, exported (save_pretrained) and loaded back (load_pretrained, and transformers'
  from_pretrained on rank 0): the same weights bit for bit, the created model's bit for bit a plain one's.
- strata.optimizer_in_backward: the same weights bit for bit as the step after backward, and exactly the gradient
  shards' bytes (4 per element of each rank's trainable shards) less on their tier, current and peak.
"""
import os

import pytest
import torch

import strata.torch as st
from common import config, reference_optimizer, rel_errors, shared_dir, train_labelled, world
from models import HF_C

VOCAB, T = 512, 12  # vocabulary 512 x 32: the embedding and the head (16384 each) are larger than a layer (9280)


def llama(tie=False, vocab=VOCAB, seed=0):
    import transformers as tr  # noqa: PLC0415
    cfg = tr.LlamaConfig(vocab_size=vocab, hidden_size=HF_C, intermediate_size=2 * HF_C, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=tie)
    torch.manual_seed(seed)
    return tr.LlamaForCausalLM(cfg)


def batch(step, rank, vocab=VOCAB):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, vocab, (2, T), generator=g)


def decoder_layer():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: PLC0415
    return LlamaDecoderLayer


def units(engine):
    return [(u.spec.name, u.spec.leaf) for u in engine.units]


def train(engine, steps):
    for step in range(steps):
        x = batch(step, st.rank())
        engine.model(x, labels=x).loss.backward()
        engine.step()


class Lm(torch.nn.Module):
    """A position parameter of the model's own (so a root), an untied embedding and head of `vocab`, and blocks."""

    def __init__(self, vocab, d=16, layers=2):
        super().__init__()
        from models import Block  # noqa: PLC0415
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(8, d) * 0.1)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        h = self.emb(x) + self.pos[: x.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def test_which_modules_are_units():
    engine = st.shard(llama(), config(3))  # every parameter outside the layers in a leaf: no root
    assert units(engine) == [("model.embed_tokens", True), ("model.layers.0", False), ("model.layers.1", False),
                             ("model.norm", True), ("lm_head", True)]
    assert engine.resolved["strata.max_live_units"] == "2"  # a unit and the next one prefetched
    engine.close()
    engine = st.shard(llama(vocab=64), config(3))  # the same, however small the embedding and the head
    assert units(engine) == [("model.embed_tokens", True), ("model.layers.0", False), ("model.layers.1", False),
                             ("model.norm", True), ("lm_head", True)]
    engine.close()
    engine = st.shard(llama(tie=True), config(3))  # one parameter: it stays the root's, and so does the norm
    assert units(engine) == [("root", False), ("model.layers.0", False), ("model.layers.1", False)]
    assert engine.units[0].spec.names == ["model.embed_tokens.weight", "model.norm.weight"]
    assert engine.resolved["strata.max_live_units"] == "3"
    engine.close()
    engine = st.shard(llama(), config(3), unit_classes=(decoder_layer(),))  # explicit classes: exactly those
    assert units(engine) == [("root", False), ("model.layers.0", False), ("model.layers.1", False)]
    engine.close()
    # a root of its own parameter: an embedding or a head at least as large as a block (1104) is a unit, a smaller
    # one stays in the root with the norm
    engine = st.shard(Lm(vocab=100), config(3))  # 1600 each
    assert units(engine) == [("root", False), ("emb", True), ("blocks.0", False), ("blocks.1", False),
                             ("head", True)]
    assert engine.units[0].spec.names == ["pos", "norm.weight", "norm.bias"]
    engine.close()
    engine = st.shard(Lm(vocab=50), config(3))  # 800 each
    assert units(engine) == [("root", False), ("blocks.0", False), ("blocks.1", False)]
    engine.close()


@pytest.mark.parametrize("reentrant", [None, False])  # None: no checkpointing
@pytest.mark.parametrize("stage", [2, 3])
def test_untied_llama_matches_torch(stage, reentrant):
    model, ref = llama(), llama()
    if reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train(), ref.train()
    engine = st.shard(model, config(stage))
    assert [leaf for _, leaf in units(engine)].count(True) == 3
    opt = reference_optimizer(ref)
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    train_labelled(model, engine, ref, opt, batch, 6)
    state, ref_state = engine.full_state_dict(), ref.state_dict()
    params = [k for k, _ in ref.named_parameters()]
    errors = rel_errors({k: state[k] for k in params}, {k: ref_state[k] for k in params})
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    for k in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert not torch.equal(state[k], start[k]), f"{k} did not move"
    engine.close()


@pytest.mark.parametrize("stage,bf16", [(1, False), (2, False), (3, False), (3, True)])
def test_leaf_units_train_bit_for_bit_as_the_root(stage, bf16):
    """Per element, a parameter's gradient, its reduction over the ranks and its update do not depend on which unit
    holds it: the weights are the same bits as with the embedding and the head in the root (in bf16 too, where
    the model's code must see the compute dtype without the root gathered)."""
    cfg = config(stage, bf16={"enabled": bf16})
    new = st.shard(llama(), cfg)
    old = st.shard(llama(), cfg, unit_classes=(decoder_layer(),))
    assert len(new.units) == len(old.units) + 2
    train(new, 4)
    train(old, 4)
    a, b = new.full_state_dict(), old.full_state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    new.close()
    old.close()


def plan_elems(sizes, live):
    """Decision 0019's slot plan: min over S of min(live, units of at most S) x S + the larger units' own slots."""
    best = None
    for s in set(sizes):
        cost = min(live, sum(n <= s for n in sizes)) * s + sum(n for n in sizes if n > s)
        best = cost if best is None else min(best, cost)
    return best


def padded(engine):
    """Each unit's elements in the engine: its flat buffer padded to a multiple of world x 16 (runtime/shard/layout.h,
    kAlignElems), so each rank's shard is 1/world of it."""
    align = 16 * st.world_size()
    return [-(-max(u.layout.total, 1) // align) * align for u in engine.units]


def device_bytes(engine):
    return engine.stats()["device_current_bytes"]


def test_pools_are_sized_by_the_units():
    """Parameters and optimizer state on the host's pinned tier: the device tier holds the gathered pool, the
    gradient pool (both planned over the units, strata.max_live_units of them live) and the reduce-scatter's
    scratch (the largest trainable shard). With the old units (the embedding, the norm and the head a 131k-element
    root, 3 live) they are larger."""
    offload = {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}

    def expected(engine):
        sizes = padded(engine)
        live = int(engine.resolved["strata.max_live_units"])
        return 4 * (2 * plan_elems(sizes, live) + max(sizes) // st.world_size())

    cfg = config(3)
    cfg["zero_optimization"].update(offload)
    new = st.shard(llama(vocab=2048), cfg)  # embedding and head 65536 each, 7x a layer
    old = st.shard(llama(vocab=2048), cfg, unit_classes=(decoder_layer(),))
    assert [leaf for _, leaf in units(new)].count(True) == 3
    assert device_bytes(new) == expected(new)
    assert device_bytes(old) == expected(old)
    assert device_bytes(new) < device_bytes(old)
    new.close()
    old.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_optimizer_in_backward_keeps_no_gradient_shards(stage):
    """With optimizer state on the pinned tier, the gradient shards are there too; strata.optimizer_in_backward
    updates each unit as its gradient is reduced: the same bits, and exactly their bytes less on that tier."""
    def cfg(fused):
        c = config(stage)
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        c["strata"]["optimizer_in_backward"] = fused
        return c

    plain, fused = st.shard(llama(), cfg(False)), st.shard(llama(), cfg(True))
    train(plain, 4)
    train(fused, 4)
    a, b = plain.full_state_dict(), fused.full_state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    shards = sum(padded(plain)) // st.world_size()  # each rank's 1/world of each unit
    sp, sf = plain.stats(), fused.stats()
    assert sp["pinned_host_current_bytes"] - sf["pinned_host_current_bytes"] == 4 * shards
    assert sp["pinned_host_peak_bytes"] - sf["pinned_host_peak_bytes"] == 4 * shards
    plain.close()
    fused.close()



def test_created_exported_and_loaded(tmp_path):
    torch.manual_seed(3)
    plain = llama(seed=3)
    engine = st.shard(lambda: llama(seed=3), config(3))
    assert [leaf for _, leaf in units(engine)].count(True) == 3
    created = engine.full_state_dict()
    for k, v in plain.state_dict().items():
        assert torch.equal(created[k], v), k
    train(engine, 2)
    out = os.path.join(shared_dir(tmp_path), "out")
    engine.save_pretrained(out, max_shard_size="40KB")
    trained = engine.full_state_dict()
    other = st.shard(lambda: llama(seed=5), config(3))
    other.load_pretrained(out)
    loaded = other.full_state_dict()
    for k in trained:
        assert torch.equal(loaded[k], trained[k]), k
    if st.rank() == 0:
        state = type(plain).from_pretrained(out).state_dict()
        for k in trained:
            assert torch.equal(state[k], trained[k]), k
    world().Barrier()
    engine.close()
    other.close()
