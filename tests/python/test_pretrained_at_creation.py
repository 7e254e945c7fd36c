"""st.shard(factory, config, pretrained=DIR): a model created sharded and loaded from a checkpoint at once, its
values bit for bit st.shard(factory, config) then engine.load_pretrained(DIR)'s, without computing the random
initialisation of the parameters DIR supplies (Note [Draws left for later] in _deferred; docs/decisions/0034,
"Pretrained at creation"). The random ops are counted where the record runs them on real memory
(_deferred._draw): none for a checkpoint that supplies every parameter; a parameter the checkpoint lacks
(pretrained_strict=False) gets exactly the values it gets today, as do those of a factory that reseeds or draws
on a real tensor midway, and those of torch's initialisations (InitZoo)."""
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import strata.torch as st
from common import config, on_rank_0, shared_dir
from models import InitZoo, hf_builders
from strata.torch import _deferred
from strata.torch._pretrained import CheckpointError


def bits(t):
    return t.detach().contiguous().flatten().view(torch.uint8)


class Draws:
    """Counts the random ops the record runs on real memory (recording, chains, replay: _deferred._draw)."""

    def __init__(self):
        self.ops = 0

    def __call__(self, func, args, kwargs):
        self.ops += 1

    def __enter__(self):
        _deferred._draw_hook.append(self)
        return self

    def __exit__(self, *exc):
        _deferred._draw_hook.remove(self)


def state_of(engine):
    """Every value a model created sharded holds: its full state dict and its other buffers (non-persistent)."""
    out = {k: v.clone() for k, v in engine.full_state_dict().items()}
    for k, b in engine.model.named_buffers():
        out.setdefault("buffer " + k, b.clone())
    return out


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(bits(got[k]), bits(want[k])), k


def old_and_new(build, path, strict=True, stage=3):
    """(values, draws, keys) of st.shard + load_pretrained, then of st.shard(pretrained=), from one seed."""
    out = []
    for pretrained in (False, True):
        torch.manual_seed(2)  # other initial values than the checkpoint's
        with Draws() as d:
            if pretrained:
                engine = st.shard(build, config(stage), pretrained=path, pretrained_strict=strict)
                keys = engine.pretrained_keys
            else:
                engine = st.shard(build, config(stage))
                keys = engine.load_pretrained(path, strict=strict)
        out.append((state_of(engine), d.ops, keys))
        engine.close()
    return out


def save_from(path, build, seed=1, drop=()):
    def save():
        torch.manual_seed(seed)
        m = build()
        m.save_pretrained(path)
        if drop:
            f = os.path.join(path, "model.safetensors")
            sd = load_file(f)
            for k in drop:
                sd.pop(k)
            save_file(sd, f, metadata={"format": "pt"})
    on_rank_0(save)


@pytest.mark.parametrize("name,stage", [("gpt2", 3), ("gpt2", 1), ("llama", 3), ("mixtral", 3), ("bert", 3)])
def test_pretrained_at_creation_equals_shard_then_load_and_draws_nothing(name, stage, tmp_path):
    path = os.path.join(shared_dir(tmp_path), name)
    build = hf_builders()[name]
    save_from(path, build)
    (old, old_draws, old_keys), (new, new_draws, new_keys) = old_and_new(build, path, stage=stage)
    assert old_keys == new_keys == {"missing_keys": [], "unexpected_keys": []}
    assert_same(new, old)
    torch.manual_seed(1)
    ref = build().state_dict()
    for k in ref:  # and both are the checkpoint's values
        assert torch.equal(bits(new[k]), bits(ref[k])), k
    weights = sum(1 for n, p in build().named_parameters() if n.endswith("weight") and p.ndim == 2)
    assert old_draws >= weights  # the count sees the draws the old path makes (at least one per matrix) ...
    assert new_draws == 0  # ... and there are none when the checkpoint supplies every parameter


@pytest.mark.parametrize("name,drop", [
    ("gpt2", ("transformer.h.1.mlp.c_fc.weight",)),  # late in the construction: its draws follow many others
    ("llama", ("model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight")),
    ("llama", ("lm_head.weight",)),
])
def test_a_parameter_the_checkpoint_lacks_gets_todays_values(name, drop, tmp_path):
    path = os.path.join(shared_dir(tmp_path), name + "-" + drop[0])
    build = hf_builders()[name]
    save_from(path, build, drop=drop)
    (old, old_draws, old_keys), (new, new_draws, new_keys) = old_and_new(build, path, strict=False)
    assert new_keys == old_keys and sorted(old_keys["missing_keys"]) == sorted(drop)
    assert_same(new, old)
    torch.manual_seed(1)
    ref = build().state_dict()
    for k in drop:  # not the checkpoint's: the random initial values, as created
        assert not torch.equal(new[k], ref[k]), k
    assert 0 < new_draws < old_draws


class Reseeding(torch.nn.Module):
    """A factory that draws on a real tensor and reseeds the CPU generator halfway through its construction."""

    def __init__(self, outside):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        outside.normal_()  # a real tensor: drawn now, after the draws of `a` (a flush of the chain)
        self.register_buffer("noise", outside.clone())
        self.b = torch.nn.Linear(16, 16)
        torch.manual_seed(11)  # the factory reseeds: a new chain from the new state
        self.c = torch.nn.Linear(16, 8)
        self.d = torch.nn.Linear(8, 8)


def test_a_factory_that_reseeds_or_draws_on_real_tensors(tmp_path):
    path = os.path.join(shared_dir(tmp_path), "reseeding")

    def save():
        torch.manual_seed(1)
        m = Reseeding(torch.empty(4))
        os.makedirs(path, exist_ok=True)
        sd = {k: v for k, v in m.state_dict().items() if k not in ("b.weight", "d.weight")}
        save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    on_rank_0(save)
    out = []
    for pretrained in (False, True):
        torch.manual_seed(2)
        outside = torch.empty(4)
        if pretrained:
            engine = st.shard(lambda: Reseeding(outside), config(3), pretrained=path, pretrained_strict=False)
            keys = engine.pretrained_keys
        else:
            engine = st.shard(lambda: Reseeding(outside), config(3))
            keys = engine.load_pretrained(path, strict=False)
        assert keys == {"missing_keys": ["b.weight", "d.weight"], "unexpected_keys": []}
        out.append((state_of(engine), outside.clone()))
        engine.close()
    assert_same(out[1][0], out[0][0])
    assert torch.equal(out[1][1], out[0][1])  # the real tensor drew from where a plain construction would


@pytest.mark.parametrize("stage", [1, 3])
def test_torch_inits_of_the_parameters_a_checkpoint_lacks(stage, tmp_path):
    """InitZoo (torch's initialisations, a user generator, values read while it is built, deepcopy): a
    checkpoint with every other parameter, the rest created as today."""
    path = os.path.join(shared_dir(tmp_path), "zoo")

    def save():
        torch.manual_seed(1)
        sd = InitZoo().state_dict()
        keep = {k: v.contiguous().clone() for i, (k, v) in enumerate(sd.items()) if i % 2 == 0}
        os.makedirs(path, exist_ok=True)
        save_file(keep, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    on_rank_0(save)
    (old, old_draws, old_keys), (new, new_draws, new_keys) = old_and_new(InitZoo, path, strict=False, stage=stage)
    assert new_keys == old_keys and old_keys["missing_keys"]
    assert_same(new, old)
    assert new_draws < old_draws


def test_a_bad_checkpoint_is_refused_at_creation_on_every_rank(tmp_path):
    path = os.path.join(shared_dir(tmp_path), "gpt2")
    save_from(path, hf_builders()["gpt2"], drop=("transformer.ln_f.bias",))
    with pytest.raises(CheckpointError, match=r"missing transformer\.ln_f\.bias \(strict=False, or st\.shard's "
                                              r"pretrained_strict=False"):
        st.shard(hf_builders()["gpt2"], config(3), pretrained=path)
    with pytest.raises(CheckpointError, match="no-such-dir"):
        st.shard(hf_builders()["gpt2"], config(3), pretrained=os.path.join(path, "no-such-dir"))


def test_a_built_model_loads_its_checkpoint_at_shard_too(tmp_path):
    path = os.path.join(shared_dir(tmp_path), "gpt2")
    build = hf_builders()["gpt2"]
    save_from(path, build)
    torch.manual_seed(2)
    engine = st.shard(build(), config(3), pretrained=path)
    torch.manual_seed(1)
    ref = build().state_dict()
    state = engine.full_state_dict()
    for k in ref:
        assert torch.equal(bits(state[k]), bits(ref[k])), k
    engine.close()
