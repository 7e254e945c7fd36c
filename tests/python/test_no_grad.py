"""A parameter without a gradient is not a zero gradient (Note [Parameters without a gradient] in
runtime/engine/engine_step.cc): torch.optim.AdamW skips a parameter whose .grad is None (no weight decay, its
moments untouched, its own step count not advanced), and so does strata.torch by default
(strata.params_without_grad "skip"), against plain torch on the global batch at stages 0-3: a branch used
in some steps only, a parameter never used, a unit never used, a branch used by one rank only."""
import pytest
import torch
from torch import nn

import strata.torch as st
from common import assert_matches, config, reference_optimizer, shared_dir
from models import Block, batches, seeded

STEPS = 10


class Branchy(nn.Module):
    """Blocks 0 and 1 always run, block 2 never (a unit without a use); `extra` runs when asked (a
    conditional branch in the root unit); `never` is in the root and never used."""

    def __init__(self, vocab=37, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(3))
        self.extra = nn.Linear(d, d)
        self.never = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab)

    def forward(self, x, labels, extra=False):
        h = self.emb(x)
        for b in self.blocks[:2]:
            h = b(h)
        if extra:
            h = h + self.extra(h)
        return nn.functional.cross_entropy(self.out(h).flatten(0, 1), labels.flatten())


def uses_extra(step, micro, rank):
    """Steps 0 and 5 (every rank, the first micro-batch), and step 7 on rank 1 only: skipped in between, so
    the step count of its next update is its own, not the job's."""
    return (step in (0, 5) and micro == 0) or (step == 7 and rank == 1)


def train(model, engine, steps, accumulation, first=0):
    for step in range(first, steps):
        for micro in range(accumulation):
            x, y = batches(step, micro, st.rank())
            model(x, y, extra=uses_extra(step, micro, st.rank())).backward()
        engine.step()


def train_reference(ref, steps, accumulation):
    opt = reference_optimizer(ref)
    world = st.world_size()
    for step in range(steps):
        for micro in range(accumulation):
            for r in range(world):
                x, y = batches(step, micro, r)
                (ref(x, y, extra=uses_extra(step, micro, r)) / (world * accumulation)).backward()
        opt.step()
        opt.zero_grad()  # set_to_none: a parameter without a gradient next step is skipped


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_parameters_without_a_gradient_are_skipped_as_torch_does(stage, accumulation):
    start = seeded(Branchy)
    model, ref = seeded(Branchy), seeded(Branchy)
    engine = st.shard(model, config(stage, accumulation))
    train(model, engine, STEPS, accumulation)
    train_reference(ref, STEPS, accumulation)
    state = engine.full_state_dict()
    assert_matches(state, ref.state_dict())
    for name in ("never.weight", "never.bias", "blocks.2.fc1.weight", "blocks.2.norm.bias"):  # no gradient, ever
        assert torch.equal(state[name], start.state_dict()[name]), name
    assert not torch.equal(state["extra.weight"], start.state_dict()["extra.weight"])
    engine.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeeds_rule_is_a_named_key(stage):
    """strata.params_without_grad "zero": a parameter without a gradient is updated with a zero one (DeepSpeed's
    rule), so weight decay moves a weight that is never used."""
    start = seeded(Branchy)
    model = seeded(Branchy)
    cfg = config(stage)
    cfg["strata"]["params_without_grad"] = "zero"
    engine = st.shard(model, cfg)
    train(model, engine, 3, 1)
    state = engine.full_state_dict()
    assert not torch.equal(state["never.weight"], start.state_dict()["never.weight"])
    engine.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_skipped_steps_survive_a_checkpoint(stage, tmp_path):
    """Saved at step 4 (extra has skipped steps 1-3), resumed into a fresh engine: the same weights bit for bit
    as without the interruption, so each parameter's own step count was restored."""
    root = shared_dir(tmp_path)
    model = seeded(Branchy)
    engine = st.shard(model, config(stage))
    train(model, engine, STEPS, 1)
    whole = engine.full_state_dict()
    engine.close()
    model = seeded(Branchy)
    engine = st.shard(model, config(stage))
    train(model, engine, 4, 1)
    engine.save_checkpoint(root)
    engine.close()
    model = seeded(Branchy)
    engine = st.shard(model, config(stage))
    engine.load_checkpoint(root)
    train(model, engine, STEPS, 1, first=4)
    resumed = engine.full_state_dict()
    for name, t in whole.items():
        assert torch.equal(resumed[name], t), name
    engine.close()
