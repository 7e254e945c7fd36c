"""Note [A collective per unit] (strata.torch._engine), under every launcher: st.shard broadcasts rank 0's initial
values one unit at a time, and full_state_dict and st.GatheredParameters gather a unit's parameters in one
collective (gather_unit), never one per parameter (gather_param, which gathers the whole unit each time)."""
import torch

import strata.torch as st
from common import config, train
from models import tiny_lm
from strata import _comm


def test_whole_values_move_one_collective_per_unit(monkeypatch):
    broadcasts = []
    real = _comm.broadcast_from_0
    monkeypatch.setattr(_comm, "broadcast_from_0", lambda t: broadcasts.append(t.numel()) or real(t))
    model = tiny_lm()
    engine = st.shard(model, config(3))
    n = sum(p.numel() for p in tiny_lm().parameters())
    assert len(broadcasts) == len(engine.units) and sum(broadcasts) == n, broadcasts
    train(model, engine, 0, 1)
    gathered, one = [], []
    inner = engine.gather_unit
    engine.gather_unit = lambda unit: gathered.append(unit) or inner(unit)
    engine.gather = lambda *a: one.append(a)  # the per-parameter gather is not used
    full = engine.full_state_dict()
    assert sorted(gathered) == [u.id for u in engine.units] and not one, gathered
    assert full["head.weight"] is full["emb.weight"]  # tied: one tensor
    assert all(v.untyped_storage().nbytes() == v.numel() * 4 for k, v in full.items() if k != "head.weight")
    gathered.clear()
    with st.GatheredParameters(engine):
        assert torch.equal(model.blocks[1].fc1.weight, full["blocks.1.fc1.weight"])
    assert sorted(gathered) == [u.id for u in engine.units] and not one, gathered
    del engine.gather_unit, engine.gather
    engine.close()
