"""Real DeepSpeed configs (tests/configs/deepspeed, sources in SOURCES.md) through st.shard on a small Hugging
Face GPT-2: each trains unchanged (two steps, fp16 ones through engine.backward) or is refused once, by the
C++ parser, with an error naming exactly the key paths expected.json lists for st.shard (docs/decisions/0028).
Also: DeepSpeed's semantics that strata.torch shows itself (the derived accumulation, fp16 loss scaling, the
weight decay of 1-D parameters)."""
import json
import math
import os
import re

import pytest
import torch

import strata.torch as st
from models import hf_gpt2, hf_gpt2_batch as batch

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "deepspeed")
with open(os.path.join(CONFIGS, "expected.json"), encoding="utf-8") as f:
    EXPECTED = json.load(f)


def test_the_corpus_is_complete():
    files = sorted(f for f in os.listdir(CONFIGS) if f.endswith(".json") and f != "expected.json")
    assert files == sorted(EXPECTED) and len(files) >= 20


def named_keys(message):
    return set(re.findall(r"config key '([^']*)'", message))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_deepspeed_config_trains_or_is_refused_once(name):
    path = os.path.join(CONFIGS, name)
    refused = EXPECTED[name]["st_shard"]
    model = hf_gpt2()
    if refused:
        with pytest.raises(st.StrataError) as e:
            st.shard(model, path)
        assert named_keys(str(e.value)) == set(refused), str(e.value)
        return
    engine = st.shard(model, path)
    for step in range(2):
        for _ in range(engine.accumulation):
            x = batch(step, st.rank())
            engine.backward(model(x, labels=x).loss)
        r = engine.step()
        assert math.isfinite(r["grad_norm"]) or r["skipped"]
    engine.close()


def test_train_batch_size_derives_the_accumulation():
    """DeepSpeed: train_batch_size 8 with micro-batch 2 is accumulation 4 / ranks."""
    world = st.world_size()
    if 8 % (2 * world):
        pytest.skip("8 sequences do not split over this many ranks")
    engine = st.shard(hf_gpt2(), {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2})
    assert engine.accumulation == 8 // (2 * world)
    assert engine.resolved["train_batch_size"] == "8"
    engine.close()


def test_fp16_scales_the_loss_and_refuses_a_plain_backward():
    model = hf_gpt2()
    engine = st.shard(model, {"fp16": {"enabled": True, "initial_scale_power": 10},
                              "zero_optimization": {"stage": 3}})
    assert engine.loss_scale() == 1024.0
    x = batch(0, st.rank())
    with pytest.raises(RuntimeError, match=r"engine.backward\(loss\)"):
        model(x, labels=x).loss.backward()
    engine.close()
    model = hf_gpt2()
    engine = st.shard(model, {"fp16": {"enabled": True, "initial_scale_power": 10}, "optimizer": {"type": "AdamW"}})
    losses = []
    for step in range(3):
        x = batch(step, st.rank())
        loss = model(x, labels=x).loss
        losses.append(st.all_reduce_mean(loss.item()))
        engine.backward(loss)
        r = engine.step()
        assert not r["skipped"] and math.isfinite(r["grad_norm"])
        assert r["loss_scale"] == 1024.0
    assert all(math.isfinite(v) for v in losses)
    engine.close()


def test_weight_decay_reaches_1d_parameters_as_in_deepspeed():
    """DeepSpeed decays every parameter of the group: a bias with a zero gradient shrinks by lr x wd."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    bias = model[1].bias.detach().clone()
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.5}}}
    for decay_1d, want in ((True, bias * (1 - 0.1 * 0.5)), (False, bias)):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        m.load_state_dict(model.state_dict())
        engine = st.shard(m, {**cfg, "strata": {"weight_decay_1d": decay_1d, "optimizer_threads": 1}})
        (m(torch.zeros(2, 4)) * 0).sum().backward()  # every gradient zero: only the decay moves a parameter
        engine.step()
        got = engine.full_state_dict()["1.bias"]
        assert torch.equal(got, want.to(got.dtype)), (decay_1d, got, want)
        engine.close()
