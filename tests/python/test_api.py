"""The small API: ranks, all_reduce_mean, rank 0's initial values, the units a model is split into."""
import os

import torch

import strata.torch as st
from common import config
from models import tiny_lm


def test_rank_and_world_size():
    assert st.world_size() == int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    assert 0 <= st.rank() < st.world_size()


def test_all_reduce_mean():
    w = st.world_size()
    assert st.all_reduce_mean(float(st.rank())) == (w - 1) / 2
    t = st.all_reduce_mean(torch.tensor([st.rank(), 1.0], dtype=torch.float32))
    assert t.dtype == torch.float32 and torch.equal(t, torch.tensor([(w - 1) / 2, 1.0]))


def test_initial_values_are_rank_0s():
    model = tiny_lm(seed=st.rank())  # every rank starts from other values
    engine = st.shard(model, config(3))
    state = engine.full_state_dict()
    expected = tiny_lm(seed=0).state_dict()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    engine.close()


def test_units_and_placeholders():
    model = tiny_lm()
    engine = st.shard(model, config(3))
    assert [u.spec.name for u in engine.units] == ["root", "blocks.0", "blocks.1", "blocks.2"]
    root = engine.units[0].spec.names
    assert root == ["pos", "emb.weight", "norm.weight", "norm.bias"]  # the tied head is emb.weight
    # between steps no parameter holds data: the engine's buffers are the only copy
    assert all(p.numel() == 0 for p in model.parameters())
    engine.close()
