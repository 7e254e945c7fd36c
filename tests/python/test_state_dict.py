"""The save and edit paths users already call, on a sharded model (issue 31: they work or they refuse):
model.state_dict() gives full tensors (equal to engine.full_state_dict(), tied names sharing one) at
stages 0-3, and load_state_dict() writes rank 0's values into the engine, the optimizer's master included
(training then follows torch given the same load); transformers' save_pretrained -> from_pretrained and
peft's adapter save_pretrained -> PeftModel.from_pretrained give the logits of a model loaded from
full_state_dict(); st.GatheredParameters reads full values and, with modifier_rank, lands one rank's edit
in the engine (training then follows torch given the same edit); a hand-called clip_grad_norm_ between a
backward and step() raises naming `gradient_clipping` instead of returning 0."""
import os

import peft
import pytest
import torch
from transformers import GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import strata.torch as st
from common import config, reference_optimizer, reference_train, rel_errors, shared_dir, world, train
from models import batches, hf_gpt2 as gpt2, hf_gpt2_batch as gpt2_batch, tiny_lm

STAGES = [0, 1, 2, 3]
hf_logging.set_verbosity_error()


def assert_close(state, ref, bound=1e-5):
    errors = rel_errors(state, ref.state_dict())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= bound, f"{worst}: relative L2 error {errors[worst]:.3g}"


def all_placeholders(model):
    return all(p.numel() == 0 for p in model.parameters())


def barrier():
    world().Barrier()


# ---- state_dict / load_state_dict ----
@pytest.mark.parametrize("stage", STAGES)
def test_state_dict_is_the_full_state_dict(stage):
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    train(model, engine, 0, 2)
    full = engine.full_state_dict()
    state = model.state_dict()
    assert list(state) == list(full)
    for k, v in full.items():
        assert state[k].shape == v.shape and torch.equal(state[k], v), k
    assert state["emb.weight"].numel() > 0
    assert state["head.weight"].data_ptr() == state["emb.weight"].data_ptr()  # tied: one tensor, as torch's
    assert all_placeholders(model)  # nothing was left gathered
    # a submodule's (the names under its own prefix), and with keep_vars the Parameters themselves
    block = model.blocks[1].state_dict(prefix="blocks.1.")
    assert set(block) == {k for k in full if k.startswith("blocks.1.")}
    assert all(torch.equal(v, full[k]) for k, v in block.items())
    assert model.state_dict(keep_vars=True)["emb.weight"] is model.emb.weight
    # training goes on (and state_dict follows it)
    train(model, engine, 2, 3)
    assert not torch.equal(model.state_dict()["blocks.0.fc1.weight"], full["blocks.0.fc1.weight"])
    assert torch.equal(model.state_dict()["blocks.0.fc1.weight"], engine.full_state_dict()["blocks.0.fc1.weight"])
    engine.close()
    with pytest.raises(RuntimeError, match=r"closed; its values are gone"):
        model.state_dict()


@pytest.mark.parametrize("stage", STAGES)
def test_load_state_dict_writes_the_engine(stage):
    """Rank 0's dictionary is loaded on every rank (the others pass other values here); the fp32 master
    follows, so the next steps match torch after the same load_state_dict (Adam's moments kept on both)."""
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    train(model, engine, 0, 1)
    reference_train(ref, opt, 0, 1)
    new = tiny_lm(seed=5).state_dict()
    mine = new if st.rank() == 0 else {k: v + 1.0 for k, v in new.items()}
    result = model.load_state_dict(mine)
    assert not result.missing_keys and not result.unexpected_keys
    ref.load_state_dict(new)
    state = engine.full_state_dict()
    assert all(torch.equal(state[k], new[k]) for k in new)
    assert all_placeholders(model)
    train(model, engine, 1, 3)
    reference_train(ref, opt, 1, 3)
    assert_close(engine.full_state_dict(), ref)
    # torch's refusals, with the model's true shapes; the other entries are loaded, as torch does
    before = engine.full_state_dict()
    bad = {k: v.clone() for k, v in new.items()}
    bad["blocks.0.fc1.weight"] = torch.zeros(3, 3)
    bad["norm.bias"] = bad["norm.bias"] + 0.5
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.0\.fc1\.weight: copying a param with "
                                           r"shape torch\.Size\(\[3, 3\]\) from checkpoint, the shape in current "
                                           r"model is torch\.Size\(\[32, 16\]\)"):
        model.load_state_dict(bad)
    state = engine.full_state_dict()
    assert torch.equal(state["blocks.0.fc1.weight"], before["blocks.0.fc1.weight"])
    assert torch.equal(state["norm.bias"], bad["norm.bias"])
    partial = {k: v for k, v in new.items() if k != "blocks.2.fc2.bias"}
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "blocks\.2\.fc2\.bias"'):
        model.load_state_dict(partial)
    result = model.load_state_dict(partial, strict=False)
    assert result.missing_keys == ["blocks.2.fc2.bias"] and not result.unexpected_keys
    assert all_placeholders(model)
    engine.close()


# ---- transformers and peft ----


def train_gpt2(model, engine, steps):
    for step in range(steps):
        x = gpt2_batch(step, st.rank())
        model(input_ids=x, labels=x).loss.backward()
        engine.step()


@pytest.mark.parametrize("stage", [1, 3])
def test_transformers_save_pretrained_round_trip(stage, tmp_path):
    """Every rank calls save_pretrained (each takes part in the gathers); rank 0 alone writes."""
    model = gpt2()
    engine = st.shard(model, config(stage))
    train_gpt2(model, engine, 2)
    path = os.path.join(shared_dir(tmp_path), f"gpt2-stage{stage}")
    model.save_pretrained(path, is_main_process=st.rank() == 0)
    full = engine.full_state_dict()
    x = gpt2_batch(99, 0)
    with torch.no_grad():
        sharded_logits = model(input_ids=x).logits
    barrier()  # rank 0 has written
    loaded = GPT2LMHeadModel.from_pretrained(path)
    reference = GPT2LMHeadModel(model.config)
    reference.load_state_dict(full)
    loaded.eval(), reference.eval()
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    with torch.no_grad():
        logits = loaded(input_ids=x).logits
        assert torch.equal(logits, reference(input_ids=x).logits)
    assert torch.allclose(logits, sharded_logits, rtol=1e-5, atol=1e-5)
    assert not torch.equal(full["transformer.h.0.attn.c_attn.weight"], gpt2().transformer.h[0].attn.c_attn.weight)
    barrier()  # nobody leaves while another rank still reads the files
    engine.close()


def test_peft_lora_adapter_round_trip(tmp_path):
    lora = dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_dropout=0.0)
    model = peft.get_peft_model(gpt2(), peft.LoraConfig(**lora))
    engine = st.shard(model, config(3))
    assert any(u.spec.frozen for u in engine.units) and not all(u.spec.frozen for u in engine.units)
    train_gpt2(model, engine, 3)
    path = os.path.join(shared_dir(tmp_path), "lora")
    model.save_pretrained(path, is_main_process=st.rank() == 0)
    full = engine.full_state_dict()
    adapters = {k: v for k, v in full.items() if "lora_" in k}
    assert adapters and all(v.numel() > 0 for v in adapters.values())
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapters.items())  # trained (B starts at 0)
    barrier()
    loaded = peft.PeftModel.from_pretrained(gpt2(), path)  # the base: gpt2(), which training left unchanged
    reference = peft.get_peft_model(gpt2(), peft.LoraConfig(**lora))
    reference.load_state_dict(full)
    loaded.eval(), reference.eval()
    x = gpt2_batch(99, 0)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, reference(input_ids=x).logits)
    barrier()
    # load_state_dict writes frozen parameters (the base) as well as trainable ones (the adapters)
    changed = {k: v + 0.01 if v.is_floating_point() else v for k, v in full.items()}
    model.load_state_dict(changed)
    state = engine.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in changed.items())
    engine.close()


# ---- GatheredParameters ----
@pytest.mark.parametrize("stage", STAGES)
def test_gathered_parameters_read_and_edit(stage):
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    train(model, engine, 0, 1)
    reference_train(ref, opt, 0, 1)
    full = engine.full_state_dict()
    # read: the listed parameters hold their full values inside, placeholders again after
    with st.GatheredParameters(model.blocks[1]):
        for n, p in model.blocks[1].named_parameters():
            assert torch.equal(p, full[f"blocks.1.{n}"]), n
        assert model.blocks[0].fc1.weight.numel() == 0  # not listed: not gathered
    assert all_placeholders(model)
    with st.GatheredParameters(engine):  # every parameter; the tied one once
        assert torch.equal(model.head.weight, full["emb.weight"]) and model.head.weight is model.emb.weight
        with st.GatheredParameters(model.norm.weight):  # nested: the outer context keeps it
            assert torch.equal(model.norm.weight, full["norm.weight"])
        assert model.norm.weight.numel() > 0
    assert all_placeholders(model)
    # edit: the last rank's changes land in the engine on every rank, the others' are dropped
    last = st.world_size() - 1
    w, emb = model.blocks[0].fc1.weight, model.emb.weight
    with st.GatheredParameters([w, emb, model.norm.bias], modifier_rank=last):
        with torch.no_grad():
            w[0].fill_(0.25 + st.rank())
            emb.mul_(0.5 if st.rank() == last else 2.0)
    with torch.no_grad():
        ref.blocks[0].fc1.weight[0].fill_(0.25 + last)
        ref.emb.weight.mul_(0.5)
    expected = {k: v.clone() for k, v in full.items()}
    expected["blocks.0.fc1.weight"][0] = 0.25 + last
    expected["emb.weight"] = expected["head.weight"] = full["emb.weight"] * 0.5
    state = engine.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in expected.items())
    assert all_placeholders(model)
    train(model, engine, 1, 3)  # the next forward and the optimizer see the edit
    reference_train(ref, opt, 1, 3)
    assert_close(engine.full_state_dict(), ref)
    # modifier_rank=None: reading only; a change is an error on every rank, and the engine keeps its values
    before = engine.full_state_dict()
    with pytest.raises(RuntimeError, match=r"changed inside st\.GatheredParameters\(modifier_rank=None\) "
                                           r"\(rank 0: blocks\.2\.fc2\.bias\)"):
        with st.GatheredParameters(model.blocks[2]):
            if st.rank() == 0:
                with torch.no_grad():
                    model.blocks[2].fc2.bias.add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in engine.full_state_dict().items())
    assert all_placeholders(model)
    # load_state_dict inside (DeepSpeed's idiom): the gathered parameters take it, the modifier writes it
    new = tiny_lm(seed=7).state_dict()
    with st.GatheredParameters(model, modifier_rank=0):
        model.load_state_dict(new)
    assert all(torch.equal(engine.full_state_dict()[k], v) for k, v in new.items())
    # refused inside: the forward, step(), load_checkpoint(); and the context inside a forward
    x, y = batches(9, 0, st.rank())
    model(x, y).backward()
    with st.GatheredParameters(model.norm):
        with pytest.raises(RuntimeError, match=r"forward inside st\.GatheredParameters"):
            model(x, y)
        with pytest.raises(RuntimeError, match=r"step\(\) inside st\.GatheredParameters"):
            engine.step()
        with pytest.raises(RuntimeError, match=r"load_checkpoint\(\) inside st\.GatheredParameters"):
            engine.load_checkpoint("nowhere")
    engine.step()
    handle = model.blocks[0].register_forward_pre_hook(lambda m, a: st.GatheredParameters(m.fc1).__enter__())
    with pytest.raises(RuntimeError, match=r"st\.GatheredParameters during the model's forward or backward"):
        model(x, y)
    handle.remove()
    engine.close()


def test_gathered_parameters_of_an_unsharded_model_is_a_no_op():
    m = torch.nn.Linear(2, 2)
    with st.GatheredParameters(m.parameters(), modifier_rank=0):
        assert m.weight.shape == (2, 2)
    with pytest.raises(NotImplementedError, match="external parameters"):
        st.GatheredParameters(m.weight, fwd_module=m)


# ---- .grad between a backward and step() ----
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_hand_called_clip_grad_norm_refuses(stage):
    """After a backward .grad is a marker: clip_grad_norm_, a torch optimizer or a norm over it raise naming
    gradient_clipping, `p.grad is None` is False as in torch; it is None before the first backward and after
    step() (the engine zeroed the gradients); training with accumulation and the engine's clipping still
    matches torch; a torch optimizer over other parameters is untouched."""
    accumulation, clip = 2, 0.5
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage, accumulation, clip))
    opt = reference_optimizer(ref)
    other = torch.nn.Linear(3, 3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    assert float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) == 0.0  # no gradient yet, as torch
    for step in range(2):
        for m in range(accumulation):
            x, y = batches(step, m, st.rank())
            model(x, y).backward()
            assert all(p.grad is not None for p in model.parameters())
            g = model.blocks[0].fc1.weight.grad
            assert g.dtype == torch.float32 and g.shape == (0,)  # metadata reads are allowed
            with pytest.raises(RuntimeError, match="gradient_clipping"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with pytest.raises(RuntimeError, match="gradient_clipping"):
                g.data.norm()
            with pytest.raises(RuntimeError, match=r"engine\.step\(\)"):
                torch.optim.SGD(model.parameters(), lr=0.1).step()
            with pytest.raises(RuntimeError, match="gradient_clipping"):
                model.zero_grad(set_to_none=False)  # would zero nothing: the engine's gradients are reduced
            other(torch.ones(3)).sum().backward()  # unrelated torch training is untouched
            other_opt.step()
            other_opt.zero_grad()
        engine.step()
        reference_train(ref, opt, step, step + 1, accumulation, clip)
        assert all(p.grad is None for p in model.parameters())
        assert float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) == 0.0
        model.zero_grad(set_to_none=False)
        model.zero_grad()
    assert_close(engine.full_state_dict(), ref)
    engine.close()


def test_grad_markers_bf16_and_frozen():
    """bf16 parameters get bf16 markers (autograd's bf16 gradients still reach the engine); frozen ones keep
    None."""
    model = tiny_lm()
    model.blocks[1].requires_grad_(False)
    engine = st.shard(model, config(3, bf16={"enabled": True}))
    for step in range(2):
        x, y = batches(step, 0, st.rank())
        model(x, y).backward()
        assert all((p.grad is None) == (not p.requires_grad) for p in model.parameters())
        assert model.emb.weight.grad.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="gradient_clipping"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        r = engine.step()
        assert r["grad_norm"] > 0
    engine.close()
