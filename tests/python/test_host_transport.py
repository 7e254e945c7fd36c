"""Note [The host transport under torchrun] (strata._torch_comm; docs/decisions/0053): under torchrun, with every
rank on this host, the host engine's communicator is the shared-memory one set up over gloo; STRATA_HOST_TRANSPORT
(here the `choice` argument that defaults to it) picks gloo or shm, and anything else is refused naming the
choices. Runs in the torchrun runs of the suite (tests/python/run.sh); under mpirun the engines run on MPI."""
import pytest
import torch.distributed as dist

import strata.torch as st
from common import config
from models import batches, tiny_lm
from strata import _capi, _torch_comm


def test_the_engines_communicator_is_shared_memory_on_one_host(host_group):
    model = tiny_lm()
    engine = st.shard(model, config(3))
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    engine.step()
    engine.close()
    want = "gloo" if host_group.size() == 1 else "shm"  # one rank: nothing to share
    assert _torch_comm.transport == want


@pytest.mark.parametrize("choice", ["gloo", "shm"])
def test_each_choice_is_what_it_names(host_group, choice):
    store = dist.distributed_c10d._get_default_store()
    before = _torch_comm.transport
    try:
        comm = _torch_comm.create(host_group, store, 20000, choice)
        made = _torch_comm.transport
        _capi.check(_capi.lib.strata_comm_destroy(comm))
    finally:
        _torch_comm.transport = before
    assert made == ("gloo" if host_group.size() == 1 else choice)


def test_an_unknown_choice_is_refused_naming_the_choices(host_group):
    store = dist.distributed_c10d._get_default_store()
    with pytest.raises(ValueError, match=r"STRATA_HOST_TRANSPORT='tcp': expected one of auto, shm, gloo"):
        _torch_comm.create(host_group, store, 20000, "tcp")
