"""Ranks that take different paths through the model (docs/decisions/0024-agreed-schedule.md): refused on every
rank within seconds, never a silent swap of gathered data or a wait for the collective timeout; and the
remedy the refusal names (the rank-dependent module in the root unit) trains as torch does on the global
batch."""
import time

import pytest
import torch
from torch import nn

import strata.torch as st
from common import assert_matches, config, reference_optimizer
from models import Block, batches, seeded

STEPS = 10


class Head(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, h):
        return self.out(self.norm(h))


class MultiHead(nn.Module):
    """A trunk of blocks and two task heads of the same size; `forward(x, y, head)` runs one head. The
    heads' ModuleList holds fewer parameters than the blocks', so the blocks are the default units."""

    def __init__(self, vocab=37, d=16, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.heads = nn.ModuleList(Head(d, vocab) for _ in range(2))
        self.drop = set()  # blocks skipped by the next forward (LayerDrop)

    def forward(self, x, labels, head=0):
        h = self.emb(x)
        for i, b in enumerate(self.blocks):
            if i not in self.drop:
                h = b(h)
        logits = self.heads[head](h)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def multi_head(seed=0):
    return seeded(MultiHead, seed)


def head_of(rank, micro):
    return (rank + micro) % 2  # every head is used by some rank in every step, at any world size


def assert_fails_fast(fn, *needles):
    start = time.monotonic()
    with pytest.raises(st.StrataError) as info:
        fn()
    took = time.monotonic() - start
    for n in needles:
        assert n in str(info.value), f"'{n}' not in: {info.value}"
    assert took < 5.0, f"took {took:.1f} s (the collective timeout is 20 s): {info.value}"
    return info.value


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_head_per_rank_as_units_is_refused_on_every_rank(stage):
    """Heads as units, rank r runs head (r + micro-batch) % 2: at several ranks the first micro-batch's
    paths differ and every rank gets the same error naming both heads; on one rank the second micro-batch
    departs from the first's record."""
    model = multi_head()
    engine = st.shard(model, config(stage, accumulation=2), unit_classes=(Block, Head))
    x, y = batches(0, 0, st.rank())
    if st.world_size() == 1:
        model(x, y, head=0).backward()
        x, y = batches(0, 1, 0)
        assert_fails_fast(lambda: model(x, y, head=1),
                          "unit order differs from the recorded one", "unit 'heads.1'", "unit 'heads.0'")
    else:
        assert_fails_fast(lambda: model(x, y, head=head_of(st.rank(), 0)),
                          "took different paths through the model", "the forward of unit 'heads.0'",
                          "the forward of unit 'heads.1'", "root unit")
    engine.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_head_per_rank_in_the_root_unit_matches_torch(stage):
    """The remedy: the heads in the root unit (the default units are the blocks), so every rank holds them
    and a rank that runs the other head contributes a zero gradient to it: torch on the global batch."""
    model, ref = multi_head(), multi_head()
    engine = st.shard(model, config(stage, accumulation=2))
    assert all(u.spec.name.startswith("blocks.") or u.spec.name == "root" for u in engine.units)
    opt = reference_optimizer(ref)
    world = st.world_size()
    for step in range(STEPS):
        for micro in range(2):
            x, y = batches(step, micro, st.rank())
            model(x, y, head=head_of(st.rank(), micro)).backward()
            for r in range(world):
                x, y = batches(step, micro, r)
                (ref(x, y, head=head_of(r, micro)) / (2 * world)).backward()
        engine.step()
        opt.step()
        opt.zero_grad()
    assert_matches(engine.full_state_dict(), ref.state_dict())
    engine.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_layer_dropped_on_one_rank_ends_every_rank_within_seconds(stage):
    """LayerDrop with a per-rank seed, after the first step recorded every block: the last rank skips block 1
    and fails its own check before issuing anything; every other rank, waiting for it in a collective,
    fails within seconds naming it and its cause (a failure notice), not at the 20 s timeout."""
    model = multi_head()
    engine = st.shard(model, config(stage))
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    engine.step()
    last = st.world_size() - 1
    if st.rank() == last:
        model.drop = {1}
    x, y = batches(1, 0, st.rank())

    def step():
        model(x, y).backward()
        engine.step()
    if st.rank() == last:
        err = assert_fails_fast(step, "unit order differs from the recorded one", "unit 'blocks.2'")
        assert err.code == "STRATA_ERR_FAILED_PRECONDITION"
    else:
        err = assert_fails_fast(step, f"rank {last} failed and will not join it",
                                "unit order differs from the recorded one")
        assert err.code == "STRATA_ERR_PEER_FAILED"
    engine.close()


class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, h):
        return torch.nn.functional.gelu(self.fc(h))


class TinyMoE(nn.Module):
    """Top-1 routing over four experts: each token goes to the expert its router picks, so which experts run
    depends on the data (and so on the rank); expert 3's router column is pushed down so that it is
    (almost surely) never picked anywhere."""

    def __init__(self, vocab=37, d=16, experts=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(Expert(d) for _ in range(experts))
        self.out = nn.Linear(d, vocab)

    def forward(self, x, labels):
        h = self.emb(x)
        logits = self.router(h)
        logits = logits - torch.tensor([0.0, 0.0, 0.0, 1e4])
        choice = logits.argmax(-1)
        gate = torch.softmax(logits, -1)
        mixed = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            mask = choice == e
            if mask.any():  # only the experts some token of this rank picked run
                mixed[mask] = expert(h[mask]) * gate[mask][:, e:e + 1]
        return nn.functional.cross_entropy(self.out(h + mixed).flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("stage", [1, 3])
def test_experts_routed_by_the_data(stage):
    """Experts as units: the routing differs by rank, so the ranks' paths differ and every rank is refused
    within seconds (on one rank the paths differ between micro-batches instead). In the root unit (the
    default here: the experts' ModuleList is the only one): torch on the global batch, with the expert no
    token reaches skipped as torch skips a .grad of None."""
    model = seeded(TinyMoE)
    engine = st.shard(model, config(stage), unit_classes=(Expert,))
    with pytest.raises(st.StrataError, match="different paths|differs from the recorded one|will not join it"):
        for step in range(3):
            x, y = batches(step, 0, st.rank(), n=1, t=2)  # two tokens: at most two experts run
            model(x, y).backward()
            engine.step()
    engine.close()
    model, ref = seeded(TinyMoE), seeded(TinyMoE)
    engine = st.shard(model, config(stage), unit_classes=())
    opt = reference_optimizer(ref)
    for step in range(STEPS):
        x, y = batches(step, 0, st.rank(), n=4)
        model(x, y).backward()
        engine.step()
        for r in range(st.world_size()):
            x, y = batches(step, 0, r, n=4)
            (ref(x, y) / st.world_size()).backward()
        opt.step()
        opt.zero_grad()
    state = engine.full_state_dict()
    assert ref.experts[3].fc.weight.grad is None  # never reached: torch skipped it
    assert torch.equal(state["experts.3.fc.weight"], seeded(TinyMoE).experts[3].fc.weight.detach())
    assert_matches(state, ref.state_dict())
    engine.close()
