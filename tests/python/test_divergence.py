"""Ranks that take different paths through the model (docs/decisions/0024-agreed-schedule.md): refused on every
rank within seconds, never a silent swap of gathered data or a wait for the collective timeout; and the
remedy the refusal names (the rank-dependent module in the root unit) trains as torch does on the global
batch."""
import time

import pytest
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
