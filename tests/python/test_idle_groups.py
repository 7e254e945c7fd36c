"""Note [Idle gloo groups] (strata._torch_comm; docs/decisions/0033): under torchrun the gloo groups an engine gives
back when it closes carry the next engine's collectives, and a group is taken back only when every member of it
gave it back whole. Runs in the torchrun runs of the suite (tests/python/run.sh); under mpirun the engines run on
MPI and there is no gloo group to keep."""
import gc

import pytest
import torch
import torch.distributed as dist

import strata.torch as st
from common import config
from models import batches, tiny_lm
from strata import _torch_comm


@pytest.fixture
def splits(monkeypatch):
    """The number of torch.distributed.split_group calls made so far."""
    count = [0]
    real = dist.split_group

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "split_group", counted)
    return count


def test_engines_take_back_the_groups_earlier_engines_gave_back(host_group, splits):
    """The second to sixth engines make no gloo group: each takes back the first one's, and trains as it did."""
    gc.collect()  # every rank's engines of earlier tests given back, so that the ranks hold the same groups
    steps = []
    for i in range(6):
        model = tiny_lm()
        engine = st.shard(model, config(3))
        if i == 0:
            first = splits[0]
        x, y = batches(0, 0, st.rank())
        model(x, y).backward()
        steps.append(engine.step())
        engine.close()
    assert splits[0] == first, f"{splits[0] - first} gloo groups made after the first engine"
    assert all(s == steps[0] for s in steps), steps


def test_a_group_is_taken_back_only_when_every_member_gave_it_back(host_group):
    """Rank 0 gives a group back whole while the others' call on it failed (they destroy it): the next dup makes a
    new group on every rank rather than pairing rank 0's with nothing. Given back by every rank, that new group is
    taken back by the dup after, and carries its collectives."""
    store = dist.distributed_c10d._get_default_store()
    parent = _torch_comm.Endpoint(host_group, store, owned=False)
    timeout_ms = 60001  # a key of its own: no engine's group
    a = parent.dup(timeout_ms)
    if st.rank() != 0:
        a.failed = True
    a.destroy()
    b = parent.dup(timeout_ms)
    assert b.group is not a.group or st.world_size() == 1
    b.destroy()
    c = parent.dup(timeout_ms)
    assert c.group is (a.group if st.world_size() == 1 else b.group)
    t = torch.full((2,), float(st.rank() + 1))
    dist.all_reduce(t, group=c.group)
    assert t.tolist() == [st.world_size() * (st.world_size() + 1) / 2] * 2
    c.failed = True  # destroyed, not kept: this test's groups carry nothing more
    c.destroy()


def test_a_group_whose_ranks_carried_different_calls_is_not_taken_back(host_group):
    """Given back by every rank, but rank 0 counts one call more (as a broadcast's root whose send completed while
    the peer never made the call): the next dup makes a new group rather than let the peer read that call's data."""
    parent = _torch_comm.Endpoint(host_group, dist.distributed_c10d._get_default_store(), owned=False)
    timeout_ms = 60002  # a key of its own: no engine's group
    a = parent.dup(timeout_ms)
    dist.barrier(group=a.group)
    a.calls += 1 if st.rank() == 0 else 0
    a.destroy()
    b = parent.dup(timeout_ms)
    assert b.group is not a.group or st.world_size() == 1
    b.failed = True  # destroyed, not kept
    b.destroy()
