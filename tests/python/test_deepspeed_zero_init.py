"""strata.deepspeed.zero.Init: a model built inside the block is created sharded, as st.shard(factory) creates
one (docs/decisions/0034), and deepspeed.initialize() replays it into the shards. Its values are bit for bit a
plain construction's, it trains as the same model built normally, and the parameters refuse use between the
block and initialize()."""
import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from common import config
from models import TinyLM, hf_builders, hf_gpt2_batch
from strata.torch._deferred import DeferredError, DeferredTensor
from test_created import assert_same_bits


def ds_config(stage=3):
    return config(stage, 1, train_micro_batch_size_per_gpu=2)


def under_init(build, stage=3, **init_kw):
    with deepspeed.zero.Init(**init_kw):
        model = build()
    assert all(isinstance(p, DeferredTensor) for p in model.parameters()), "the block built real tensors"
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(stage))
    return engine


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5"])
def test_built_under_init_bit_for_bit(name):
    build = hf_builders()[name]
    torch.manual_seed(31)
    plain = build()
    after = torch.get_rng_state()
    torch.manual_seed(31)
    engine = under_init(build)
    assert torch.equal(torch.get_rng_state(), after), "the generator is not where a plain construction leaves it"
    assert_same_bits(engine.strata.full_state_dict(), plain.state_dict(), "state_dict")
    assert_same_bits(dict(engine.module.named_buffers()), dict(plain.named_buffers()), "buffers")
    assert len(engine.strata.units) >= 3
    engine.destroy()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_trains_as_the_model_built_normally(stage):
    """GPT-2 (tied wte / lm_head) under zero.Init and built plainly, both through initialize: the same losses bit
    for bit for 3 steps, and the same weights after them."""
    build = hf_builders()["gpt2"]
    torch.manual_seed(4)
    model = build()
    built, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(stage))
    torch.manual_seed(4)
    created = under_init(build, stage)
    assert created.module.lm_head.weight is created.module.transformer.wte.weight
    for step in range(3):
        x = hf_gpt2_batch(step, st.rank())
        losses = []
        for e in (built, created):
            loss = e(x, labels=x).loss
            e.backward(loss)
            e.step()
            losses.append(loss.item())
        assert losses[0] == losses[1], f"step {step}: {losses}"
    assert_same_bits(created.strata.full_state_dict(), built.strata.full_state_dict(), "after training")
    built.destroy()
    created.destroy()


def test_ranks_seeded_differently_build_rank_0s_model():
    torch.manual_seed(9)
    plain = TinyLM()
    torch.manual_seed(9 + 1000 * st.rank())
    engine = under_init(TinyLM)
    assert_same_bits(engine.strata.full_state_dict(), plain.state_dict(), "state_dict")
    engine.destroy()


def test_parameters_between_the_block_and_initialize_are_refused():
    """No values exist before initialize(): a write there would be lost, so it is an error naming the fix."""
    with deepspeed.zero.Init():
        model = TinyLM()
    with pytest.raises(DeferredError, match=r"of a model built under deepspeed.zero.Init\(\): it has no values until "
                                             r"deepspeed.initialize\(\).*inside the `with deepspeed.zero.Init\(\)` "
                                             r"block, or after initialize under deepspeed.zero.GatheredParameters"):
        with torch.no_grad():
            model.head.weight.normal_()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config())
    engine.destroy()


def test_writes_inside_the_block_are_kept():
    """A script's own initialisation inside the block (model.apply) is part of the construction."""
    def build():
        m = TinyLM()
        with torch.no_grad():
            m.head.weight.mul_(0.5)
        return m

    torch.manual_seed(12)
    plain = build()
    torch.manual_seed(12)
    with deepspeed.zero.Init():
        model = TinyLM()
        with torch.no_grad():
            model.head.weight.mul_(0.5)
        with deepspeed.zero.Init():  # a block inside a block is part of it
            pass
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config())
    assert_same_bits(engine.strata.full_state_dict(), plain.state_dict(), "state_dict")
    engine.destroy()


def test_two_models_of_one_block():
    """A model and its reference model (or a teacher and a student) built in one block, each given to initialize()
    in turn: each is bit for bit the plain construction's, the same two models built one after the other."""
    torch.manual_seed(21)
    plain_a, plain_b = TinyLM(), hf_builders()["gpt2"]()
    torch.manual_seed(21)
    with deepspeed.zero.Init():
        a, b = TinyLM(), hf_builders()["gpt2"]()
    engines = []
    for model, plain, what in ((a, plain_a, "first"), (b, plain_b, "second")):
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config())
        assert_same_bits(engine.strata.full_state_dict(), plain.state_dict(), f"the {what} model")
        engines.append(engine)
    for engine in engines:
        engine.destroy()


def test_what_init_refuses_and_enabled_false():
    with pytest.raises(NotImplementedError, match=r"dtype=torch.float16\): the parameters are created fp32.*Leave "
                                                  r"dtype out"):
        deepspeed.zero.Init(dtype=torch.float16)
    with pytest.raises(NotImplementedError, match=r"module=...\): the model is built already.*give it to "
                                                  r"deepspeed.initialize\(\) directly"):
        deepspeed.zero.Init(module=TinyLM())
    with pytest.raises(NotImplementedError, match=r"mpu=...\).*data-parallel ranks only"):
        deepspeed.zero.Init(mpu=object())
    deepspeed.zero.Init(dtype=torch.float32).__exit__(None, None, None)  # fp32 is what it builds anyway
    with deepspeed.zero.Init(enabled=False):  # DeepSpeed's `enabled=stage == 3` pattern: a no-op
        model = TinyLM()
    assert not any(isinstance(p, DeferredTensor) for p in model.parameters())
