"""strata.deepspeed checkpoints in DeepSpeed's layout: <dir>/<tag>/ (default tag global_step<N>), <dir>/latest
naming the last tag; load_checkpoint(dir, tag=None) returning (path, client_state), (None, None) without a
latest file; client_state round trips as JSON or through torch.save (safe load only); tags agree across ranks."""
import os
import warnings

import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from strata import StrataError
from common import config, shared_dir
from models import batches, tiny_lm


def make():
    model = tiny_lm()
    cfg = config(3, 2, train_micro_batch_size_per_gpu=2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def train(engine, steps):
    for _ in range(steps):
        for micro in range(2):
            x, y = batches(engine.global_steps, micro, st.rank())
            engine.backward(engine(x, y))
            engine.step()


class Opaque:
    pass


def test_tags_latest_and_client_state(tmp_path):
    root = shared_dir(tmp_path)
    engine = make()
    train(engine, 1)
    at_1 = engine.strata.full_state_dict()
    rng = torch.Generator().manual_seed(3).get_state()
    engine.save_checkpoint(root, tag="first", client_state={"rng": rng, "pair": (1, 2)})  # torch.save path
    train(engine, 1)
    engine.save_checkpoint(root, client_state={"epoch": 2, "names": ["a", "b"]})  # JSON, default tag
    at_2 = engine.strata.full_state_dict()
    assert sorted(os.listdir(root)) == ["first", "global_step2", "latest"]  # no temporary file left
    with open(os.path.join(root, "latest"), encoding="utf-8") as f:
        assert f.read() == "global_step2"
    with pytest.raises(TypeError, match=r"client_state holds something a safe load"):
        engine.save_checkpoint(root, tag="bad", client_state={"x": Opaque()})
    if st.world_size() > 1:
        with pytest.raises(ValueError, match=r"different checkpoint tags \(rank 0: 'r0', rank 1: 'r1'"):
            engine.save_checkpoint(root, tag=f"r{st.rank()}")
    train(engine, 1)
    engine.destroy()

    engine = make()
    path, client_state = engine.load_checkpoint(root)  # latest
    assert path == os.path.join(root, "global_step2")
    assert client_state == {"epoch": 2, "names": ["a", "b"]}
    assert engine.global_steps == 2 and engine.micro_steps == 4
    state = engine.strata.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in at_2.items())
    path, client_state = engine.load_checkpoint(root, tag="first")
    assert path == os.path.join(root, "first") and engine.global_steps == 1
    assert torch.equal(client_state["rng"], rng) and client_state["pair"] == (1, 2)
    state = engine.strata.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in at_1.items())
    train(engine, 1)  # the loop goes on from there
    assert engine.global_steps == 2
    with pytest.raises(FileNotFoundError, match=r"checkpoint tag 'nope' not found"):
        engine.load_checkpoint(root, tag="nope")
    engine.destroy()


def test_no_latest_file_loads_nothing(tmp_path):
    engine = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert engine.load_checkpoint(shared_dir(tmp_path)) == (None, None)
    assert any("nothing loaded" in str(w.message) for w in caught) == (st.rank() == 0)
    assert engine.global_steps == 0
    engine.destroy()


def test_a_strata_torch_checkpoint_loads_by_tag(tmp_path):
    """A checkpoint root of strata.torch (or `strata train`) is a tag directory: its trainer state is the
    client state. Its parameters' weight-decay flags must be the same (here: groups like shard's default)."""
    root = shared_dir(tmp_path)
    model = tiny_lm()
    engine = st.shard(model, config(3, 1))  # decays the parameters of 2 or more dimensions
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    engine.step()
    engine.save_checkpoint(os.path.join(root, "from_strata_torch"), {"next": 1})
    saved = engine.full_state_dict()
    engine.close()

    engine = make()  # model.parameters(): every parameter decays, as in DeepSpeed
    with pytest.raises(StrataError, match=r"parameter 'root.norm.weight' decays here but did not decay in the "
                                          r"checkpoint"):
        engine.load_checkpoint(root, tag="from_strata_torch")
    engine.destroy()
    model = tiny_lm()
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2]},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups,
                                      config=config(3, 2, train_micro_batch_size_per_gpu=2))
    path, client_state = engine.load_checkpoint(root, tag="from_strata_torch")
    assert client_state == {"next": 1} and engine.global_steps == 1
    state = engine.strata.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    engine.destroy()


def test_save_16bit_model_writes_the_full_weights(tmp_path):
    root = shared_dir(tmp_path)
    model = tiny_lm()
    model.emb.weight.requires_grad_(False)  # frozen (and tied to the head)
    cfg = config(3, 1, train_micro_batch_size_per_gpu=2, bf16={"enabled": True})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=cfg)
    x, y = batches(0, 0, st.rank())
    engine.backward(engine(x, y))
    engine.step()
    assert engine.save_16bit_model(root) is True
    assert engine.save_16bit_model(root, "trainable.bin", exclude_frozen_parameters=True) is True
    full = engine.module.state_dict()
    engine.destroy()
    saved = torch.load(os.path.join(root, "pytorch_model.bin"), weights_only=True)
    assert saved.keys() == full.keys()
    bad = [k for k, v in saved.items() if v.dtype != torch.bfloat16 or not torch.equal(v, full[k].to(v.dtype))]
    assert not bad
    trainable = torch.load(os.path.join(root, "trainable.bin"), weights_only=True)
    assert set(full) - set(trainable) == {"emb.weight", "head.weight"}
