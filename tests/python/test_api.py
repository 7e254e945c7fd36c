"""The small API: ranks, all_reduce_mean, rank 0's initial values, the units a model is split into."""
import ctypes
import os

import torch

import strata.torch as st
from strata import _capi
from common import config
from models import batches, tiny_lm


def test_rank_and_world_size():
    assert st.world_size() == int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))  # mpirun, torchrun
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


def test_parameters_are_views_of_the_engine_buffers():
    """Zero copy: inside its unit a parameter's storage is the unit's gathered buffer, and during the
    unit's backward its .grad is the engine's gradient buffer (fp32), not a tensor autograd allocated."""
    model = tiny_lm()
    engine = st.shard(model, config(3))
    unit = engine.units[2]  # blocks.1
    seen = {}

    def in_forward(module, args):
        seen["param"] = module.weight.untyped_storage().data_ptr() == unit.forward_flat.untyped_storage().data_ptr()

    def in_backward(grad):
        w = model.blocks[1].fc1.weight
        ptr = ctypes.POINTER(ctypes.c_float)()  # the C ABI's own answer: strata_engine_grad
        _capi.check(_capi.lib.strata_engine_grad(engine.handle, unit.id, unit.spec.names.index("fc1.weight"),
                                                 ctypes.byref(ptr)))
        seen["grad"] = w.grad is not None and w.grad.data_ptr() == ctypes.cast(ptr, ctypes.c_void_p).value
        seen["bparam"] = w.untyped_storage().data_ptr() == unit.backward_flat.untyped_storage().data_ptr()

    model.blocks[1].fc1.register_forward_pre_hook(in_forward)
    def after_forward(module, args, out):
        out.register_hook(in_backward)  # runs in the backward, once this output's gradient is known

    model.blocks[1].fc1.register_forward_hook(after_forward)
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    engine.step()
    assert seen == {"param": True, "grad": True, "bparam": True}
    engine.close()
