"""Asynchronous checkpoints (docs/decisions/0036-async-checkpoints.md) through strata.torch and strata.deepspeed:
save_checkpoint(..., async_save=True) writes the files of a synchronous save of the same state, byte for byte,
even while training steps on, and they resume bit for bit; a write that fails in the background is raised by
the next step() (which can then be called again), naming the directory; strata.deepspeed writes `latest` only
once the tag is complete."""
import os

import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from strata import StrataError
from common import config, shared_dir, world
from models import batches, tiny_lm
import test_checkpoint

SAVE_AT, STEPS = 3, 6


def train(model, engine, first, last):
    return test_checkpoint.train(model, engine, first, last, test_checkpoint.own_batch)


def files(d):
    out = {}
    for base, _, names in os.walk(d):
        for n in names:
            with open(os.path.join(base, n), "rb") as f:
                out[os.path.relpath(os.path.join(base, n), d)] = f.read()
    return out


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_async_save_equals_sync_and_resumes(stage, tmp_path):
    root = shared_dir(tmp_path)
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    train(model, engine, 0, SAVE_AT)
    engine.save_checkpoint(os.path.join(root, "sync"), {"next_step": SAVE_AT})
    engine.save_checkpoint(os.path.join(root, "async"), {"next_step": SAVE_AT}, async_save=True)
    after = train(model, engine, SAVE_AT, STEPS)  # while the save may still be writing
    engine.wait_checkpoint()
    assert not engine.checkpoint_in_flight()
    final = engine.full_state_dict()
    engine.close()
    step = f"step_{SAVE_AT:08d}"
    sync, written = files(os.path.join(root, "sync", step)), files(os.path.join(root, "async", step))
    assert "manifest.json" in sync and sorted(sync) == sorted(written)
    assert all(sync[k] == written[k] for k in sync), [k for k in sync if sync[k] != written[k]]

    model2 = tiny_lm(seed=7)
    engine2 = st.shard(model2, config(stage))
    assert engine2.load_checkpoint(os.path.join(root, "async")) == {"next_step": SAVE_AT}
    assert train(model2, engine2, SAVE_AT, STEPS) == after
    state = engine2.full_state_dict()
    assert all(torch.equal(state[k], final[k]) for k in final)
    engine2.close()


def test_failed_async_save_is_raised_by_the_next_step(tmp_path):
    root = shared_dir(tmp_path)
    model = tiny_lm()
    engine = st.shard(model, config(3))
    train(model, engine, 0, 1)
    step_dir = os.path.join(root, "step_00000001")
    if st.rank() == 0:  # a directory where rank 0's shard file goes: its rename fails on the writer thread
        os.makedirs(os.path.join(step_dir, "shard_00000.bin", "in_the_way"))
    world().Barrier()
    engine.save_checkpoint(root, async_save=True)  # returns before the write
    while engine.checkpoint_in_flight():
        pass
    x, y = batches(1, 0, st.rank())
    model(x, y).backward()
    with pytest.raises(StrataError, match="was not published") as e:
        engine.step()
    assert step_dir in str(e.value)
    assert engine.stats()["steps"] == 1  # that step was not taken
    engine.step()  # called again, it is
    assert engine.stats()["steps"] == 2
    with pytest.raises(StrataError, match="was not published"):
        engine.wait_checkpoint()  # the last save's outcome
    assert not os.path.exists(os.path.join(step_dir, "manifest.json"))
    engine.close()


def test_deepspeed_async_save_writes_latest_once_complete(tmp_path):
    root = shared_dir(tmp_path)
    model = tiny_lm()
    cfg = config(3, 2, train_micro_batch_size_per_gpu=2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)

    def ds_train(steps):
        for _ in range(steps):
            for micro in range(2):
                x, y = batches(engine.global_steps, micro, st.rank())
                engine.backward(engine(x, y))
                engine.step()

    ds_train(1)
    engine.save_checkpoint(root, tag="sync", client_state={"epoch": 1})
    engine.save_checkpoint(root, tag="async", client_state={"epoch": 1}, async_save=True)
    with open(os.path.join(root, "latest"), encoding="utf-8") as f:
        assert f.read() == "sync"  # not yet: "async" is not known to be complete
    ds_train(1)
    engine.wait_checkpoint()
    with open(os.path.join(root, "latest"), encoding="utf-8") as f:
        assert f.read() == "async"
    sync, written = files(os.path.join(root, "sync")), files(os.path.join(root, "async"))
    assert sorted(sync) == sorted(written) and all(sync[k] == written[k] for k in sync)
    engine.destroy()
    model2 = tiny_lm(seed=7)
    engine, *_ = deepspeed.initialize(model=model2, model_parameters=model2.parameters(), config=cfg)
    path, client_state = engine.load_checkpoint(root)
    assert path == os.path.join(root, "async") and client_state == {"epoch": 1}
    engine.destroy()


def test_deepspeed_async_save_as_the_last_call_still_writes_latest(tmp_path):
    """A script whose last call is an asynchronous save: destroy() (and the interpreter's exit, which closes every
    engine the same way) waits for it and writes `latest`, so load_checkpoint resumes from it, not the save
    before."""
    root = shared_dir(tmp_path)
    model = tiny_lm()
    cfg = config(3, 2, train_micro_batch_size_per_gpu=2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for micro in range(2):
        x, y = batches(0, micro, st.rank())
        engine.backward(engine(x, y))
        engine.step()
    engine.save_checkpoint(root, tag="first")
    engine.save_checkpoint(root, tag="last", client_state={"epoch": 2}, async_save=True)
    engine.destroy()
    with open(os.path.join(root, "latest"), encoding="utf-8") as f:
        assert f.read() == "last"
    model2 = tiny_lm(seed=7)
    engine, *_ = deepspeed.initialize(model=model2, model_parameters=model2.parameters(), config=cfg)
    path, client_state = engine.load_checkpoint(root)
    assert path == os.path.join(root, "last") and client_state == {"epoch": 2}
    engine.destroy()
