"""Modules transformers keeps in fp32 under a half-precision load (Note [Modules kept in fp32] in
strata/torch/_fp32_modules, docs/decisions/0045): with a bf16 (fp16) param dtype, a sharded transformers model
computes them in fp32 exactly as transformers' own from_pretrained(dtype=bf16 / fp16) model does. The reference
is that model, loaded by transformers from the same weights (save_pretrained of the fp32 model), with the
floating buffers its plan does not keep cast to the half dtype (strata.torch casts buffers as model.to does:
docs/decisions/0026-buffers.md). Forward logits match it bit for bit; a training step's loss bit for bit and the
updated master within 1e-5 per tensor (reduction order, as test_bf16)."""
import os
import tempfile

import pytest
import safetensors.torch
import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM, HYV4Config,
                          HYV4ForCausalLM, T5Config, T5ForConditionalGeneration)
from transformers.core_model_loading import build_glob_alternation

import strata.torch as st
from common import config, reference_optimizer, rel_errors, shared_dir, world

VOCAB = 64


def deepseek_v3():
    """_keep_in_fp32_modules_strict: the routers' gate.weight and their e_score_correction_bias buffer."""
    return DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64,
        attn_implementation="eager"))


def glm4_moe():
    """_keep_in_fp32_modules_strict: gate.weight and e_score_correction_bias, another architecture."""
    return Glm4MoeForCausalLM(Glm4MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_routed_experts=8, num_experts_per_tok=2,
        n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=64,
        attn_implementation="eager"))


def t5():
    """_keep_in_fp32_modules (not strict): every block's DenseReluDense.wo, under fp16 only."""
    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0, attn_implementation="eager"))


BUILDERS = {"deepseek_v3": deepseek_v3, "glm4_moe": glm4_moe, "t5": t5}
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build(name):
    """The fp32 model, the same on every rank; the routers' correction biases (zeros at init) made random and
    not representable in bf16, so a cast of them shows."""
    torch.manual_seed(0)
    model = BUILDERS[name]()
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape) * 0.05 + 1e-3)
    return model


def half_config(stage, half, **extra):
    cfg = config(stage, **extra)
    if half == "bf16":
        cfg["bf16"] = {"enabled": True}
    else:
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 0}
    return cfg


def hf_reference(model, dtype):
    """transformers' own half-precision model of `model`'s weights: from_pretrained(dtype=...) of its save (in a
    directory of this rank's own), its floating buffers outside transformers' dtype plan then cast to `dtype`,
    as strata.torch casts them."""
    with tempfile.TemporaryDirectory() as directory:  # save_pretrained writes on rank 0 only under torchrun
        model.config.save_pretrained(directory)
        safetensors.torch.save_model(model, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        ref = type(model).from_pretrained(directory, dtype=dtype, attn_implementation="eager")
    plan = ref._get_dtype_plan(dtype)
    kept = build_glob_alternation(list(plan))[0] if plan else None
    for prefix, m in ref.named_modules():
        for k, b in m._buffers.items():
            name = f"{prefix}.{k}" if prefix else k
            if b is not None and b.is_floating_point() and not (kept is not None and kept.search(name)):
                m._buffers[k] = b.to(dtype)
    return ref


def kept_in_fp32(ref, dtype):
    """The parameters transformers' model holds in fp32 (none when its plan keeps none under `dtype`)."""
    return [n for n, p in ref.named_parameters() if p.dtype == torch.float32 and dtype != torch.float32]


def inputs(name, rank=0, step=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, VOCAB, (2, 12), generator=g)
    return {"input_ids": x, "decoder_input_ids": x[:, :7]} if name == "t5" else {"input_ids": x}


def forward_dtypes(model):
    """The dtype each Linear's weight had while its forward ran, by module name (filled as the model runs)."""
    seen = {}
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) or hasattr(m, "e_score_correction_bias"):
            m.register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, m.weight.dtype))
    return seen


@pytest.mark.parametrize("name,half", [("deepseek_v3", "bf16"), ("glm4_moe", "bf16"), ("t5", "fp16"),
                                       ("t5", "bf16")])
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_forward_matches_transformers(name, half, stage):
    dtype = HALF[half]
    model = build(name)
    ref = hf_reference(model, dtype)
    kept = kept_in_fp32(ref, dtype)
    # transformers' own rule, as installed: strict modules under bf16 and fp16, T5's (not strict) under fp16 only
    assert bool(kept) == (name != "t5" or half == "fp16"), kept
    model.eval(), ref.eval()
    seen = forward_dtypes(model)
    engine = st.shard(model, half_config(stage, half))
    with torch.no_grad():
        got = model(**inputs(name)).logits
        want = ref(**inputs(name)).logits
    alone = True
    if stage < 3 and st.world_size() > 1:  # stages 0-2: an evaluation forward stays local (rank 0 alone)
        if st.rank() == 0:
            with torch.no_grad():
                alone = torch.equal(model(**inputs(name)).logits, want)
        st.all_reduce_mean(0.0)
    engine.close()
    # the checks after the collectives: a rank failing alone must not leave the others waiting in one
    assert got.dtype == want.dtype
    assert torch.equal(got, want), f"largest difference {(got.float() - want.float()).abs().max().item():.3g}"
    for n in kept:  # the kept weights really were fp32 inside their forward, the others half
        assert seen[n.rsplit(".", 1)[0]] == torch.float32, n
    assert any(d == dtype for d in seen.values())
    assert alone


def reference_step(master, compute, opt, name, step, world):
    """One step of plain torch: each forward on a copy of the fp32 master in transformers' dtypes (the kept
    parameters fp32, the others half), fp32 gradients averaged over ranks, AdamW on the master. Returns each
    rank's loss."""
    with torch.no_grad():
        for pm, pc in zip(master.parameters(), compute.parameters()):
            pc.copy_(pm.to(pc.dtype))
    grads = [torch.zeros_like(p) for p in master.parameters()]
    losses = []
    for r in range(world):
        compute.zero_grad(set_to_none=True)
        x = inputs(name, r, step)["input_ids"]
        loss = compute(input_ids=x, labels=x).loss
        loss.backward()
        losses.append(loss.detach())
        for g, pc in zip(grads, compute.parameters()):
            if pc.grad is not None:
                g += pc.grad.to(torch.float32)
    for p, g in zip(master.parameters(), grads):
        p.grad = g / world
    opt.step()
    opt.zero_grad()
    return losses


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe"])
@pytest.mark.parametrize("stage", [0, 3])
def test_training_matches_transformers(name, stage):
    model = build(name)
    master = build(name)
    compute = hf_reference(master, torch.bfloat16)
    assert kept_in_fp32(compute, torch.bfloat16)
    model.train(), compute.train()
    engine = st.shard(model, half_config(stage, "bf16"))
    opt = reference_optimizer(master)
    x = inputs(name, st.rank())["input_ids"]
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    engine.step()
    want = reference_step(master, compute, opt, name, 0, st.world_size())
    state = engine.full_state_dict()
    engine.close()
    # each rank's loss, checked on every rank after the collectives (a rank failing alone would leave the others
    # waiting in one)
    losses = world().allgather(loss.item())
    assert losses == [w.item() for w in want], f"losses {losses} against {[w.item() for w in want]}"
    # One step: the masters then differ in their last fp32 bits (reduction order, the engine's AdamW), and in a
    # later step a flipped bf16 rounding can flip a router's choice of expert, which no tolerance bounds
    errors = rel_errors(state, dict(master.named_parameters()))
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"


def test_gathered_edit_reaches_the_fp32_module():
    """At stages 0-2 the kept units compute from a replicated fp32 copy: an edit in st.GatheredParameters
    (fp32 values bf16 cannot hold) reaches it, and the next forward still matches transformers'."""
    model = build("deepseek_v3")
    ref = hf_reference(model, torch.bfloat16)
    model.eval(), ref.eval()
    engine = st.shard(model, half_config(2, "bf16"))
    gate = model.model.layers[2].mlp.gate
    new = torch.randn(ref.model.layers[2].mlp.gate.weight.shape, generator=torch.Generator().manual_seed(7)) * 0.3
    with st.GatheredParameters([gate.weight], modifier_rank=0):
        with torch.no_grad():
            gate.weight.copy_(new)
    with torch.no_grad():
        ref.model.layers[2].mlp.gate.weight.copy_(new)
        got, want = model(**inputs("deepseek_v3")).logits, ref(**inputs("deepseek_v3")).logits
    engine.close()
    assert torch.equal(got, want)


def test_frozen_kept_parameter_warns_and_computes_in_half():
    """A frozen parameter transformers keeps in fp32 (peft freezes MoE routers; Ernie-4.5-MoE creates its routing
    bias frozen) has no fp32 master: it computes in bf16, as before the rule and as DeepSpeed computes it, with
    a warning naming it. The logits equal transformers' model with that one weight rounded to bf16; the other
    routers stay fp32."""
    model = build("deepseek_v3")
    ref = hf_reference(model, torch.bfloat16)
    model.model.layers[1].mlp.gate.weight.requires_grad_(False)
    model.eval(), ref.eval()
    with pytest.warns(UserWarning, match=r"1 frozen parameter.*'model\.layers\.1\.mlp\.gate\.weight'.*"
                                         r"keep_in_fp32_modules"):
        engine = st.shard(model, half_config(3, "bf16"))
    assert any(u.spec.fp32 for u in engine.units)  # the trainable routers are still kept
    with torch.no_grad():
        gate = ref.model.layers[1].mlp.gate
        kept = gate.weight.data
        gate.weight.data = kept.to(torch.bfloat16)
        got, want = model(**inputs("deepseek_v3")).logits, ref(**inputs("deepseek_v3")).logits
        gate.weight.data = kept
        assert not torch.equal(got, ref(**inputs("deepseek_v3")).logits)  # the rounding shows
    engine.close()
    assert torch.equal(got, want)


def test_option_none_computes_everything_in_half():
    """data_types.keep_in_fp32_modules []: every parameter and buffer in bf16, as model.to(torch.bfloat16) has
    them (the behaviour before the rule): the logits of transformers' model differ, those of model.to's equal."""
    model = build("deepseek_v3")
    ref = hf_reference(model, torch.bfloat16)
    plain = build("deepseek_v3").to(torch.bfloat16)
    model.eval(), ref.eval(), plain.eval()
    cfg = half_config(3, "bf16")
    cfg["data_types"] = {"keep_in_fp32_modules": []}
    engine = st.shard(model, cfg)
    assert not any(u.spec.fp32 for u in engine.units)
    with torch.no_grad():
        got = model(**inputs("deepseek_v3")).logits
        assert torch.equal(got, plain(**inputs("deepseek_v3")).logits)
        assert not torch.equal(got, ref(**inputs("deepseek_v3")).logits)
    engine.close()


def test_units_of_a_model_with_kept_modules():
    """The kept parameters are units of their own, named after their module's unit; a model without any is
    split as before (the other tests' models: test_bf16, test_hf_gpt2)."""
    model = build("deepseek_v3")
    engine = st.shard(model, half_config(3, "bf16"))
    fp32 = {u.spec.name: u.spec.names for u in engine.units if u.spec.fp32}
    assert fp32 == {"model.layers.1[fp32]": ["mlp.gate.weight"], "model.layers.2[fp32]": ["mlp.gate.weight"]}
    assert model.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16  # not kept: cast as model.to casts
    engine.close()


def test_listed_patterns_replace_the_models_lists():
    """data_types.keep_in_fp32_modules ["wo"]: T5's wo weights stay fp32 under bf16 too (transformers' own list
    keeps them under fp16 only): the logits of model.to(torch.bfloat16) with those weights set back to fp32."""
    model = build("t5")
    want_model = build("t5").to(torch.bfloat16)
    fp32 = build("t5")
    for n, m in want_model.named_modules():
        if n.endswith(".wo"):
            m.weight.data = fp32.get_submodule(n).weight.data
    model.eval(), want_model.eval()
    cfg = half_config(3, "bf16")
    cfg["data_types"] = {"keep_in_fp32_modules": ["wo"]}
    engine = st.shard(model, cfg)
    units = sorted(u.spec.name for u in engine.units if u.spec.fp32)
    with torch.no_grad():
        got, want = model(**inputs("t5")).logits, want_model(**inputs("t5")).logits
    engine.close()
    assert units == ["decoder.block.0[fp32]", "decoder.block.1[fp32]", "root[fp32]"]
    assert torch.equal(got, want)


@pytest.mark.parametrize("value", ["none", [1], [""], True])
def test_bad_option_is_refused(value):
    cfg = half_config(3, "bf16")
    cfg["data_types"] = {"keep_in_fp32_modules": value}
    with pytest.raises(ValueError, match=r"'data_types\.keep_in_fp32_modules' must be \"auto\" or a list"):
        st.shard(build("deepseek_v3"), cfg)


@pytest.mark.parametrize("spelling", [{"strata": {"param_dtype": "BFloat16"}},
                                      {"bf16": {"enabled": True}, "strata": {"param_dtype": "bf16"}}])
def test_every_spelling_of_bf16_keeps_them(spelling):
    """The front end reads the param dtype before the engine is built (the units depend on it) and checks the
    engine's reading after: any spelling the engine takes keeps the modules in fp32."""
    cfg = config(3)
    for k, v in spelling.items():
        cfg.setdefault(k, {}).update(v)
    engine = st.shard(build("deepseek_v3"), cfg)
    fp32 = [u.spec.name for u in engine.units if u.spec.fp32]
    dtype = engine.resolved["strata.param_dtype"]
    engine.close()
    assert dtype == "bf16" and fp32 == ["model.layers.1[fp32]", "model.layers.2[fp32]"]


def test_save_pretrained_writes_them_in_fp32(tmp_path):
    """engine.save_pretrained(dtype=torch.bfloat16) writes the kept parameters and buffers in fp32, as
    transformers' save of its own bf16 model does, so transformers' from_pretrained(dtype=bf16) of the export is
    transformers' model of the original weights, exactly (a bf16 router weight would come back rounded)."""
    model = build("deepseek_v3")
    ref = hf_reference(model, torch.bfloat16)
    engine = st.shard(model, half_config(3, "bf16"))
    directory = shared_dir(tmp_path)
    engine.save_pretrained(directory, dtype=torch.bfloat16)
    engine.close()
    world().Barrier()
    back = DeepseekV3ForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, attn_implementation="eager")
    want = dict(ref.named_parameters())
    want.update((n, b) for n, b in ref.named_buffers() if n.endswith("e_score_correction_bias"))
    got = dict(back.named_parameters())
    got.update(back.named_buffers())
    assert {n: t.dtype for n, t in want.items() if t.dtype == torch.float32} == {
        "model.layers.1.mlp.gate.weight": torch.float32, "model.layers.2.mlp.gate.weight": torch.float32,
        "model.layers.1.mlp.gate.e_score_correction_bias": torch.float32,
        "model.layers.2.mlp.gate.e_score_correction_bias": torch.float32}
    for n, t in want.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n


def test_tied_weight_takes_its_checkpoint_names_dtype(tmp_path):
    """HY-V4 lists `lm_head` in _keep_in_fp32_modules_strict; with tie_word_embeddings its lm_head is the input
    embedding, which transformers writes and loads under `model.embed_tokens.weight` (the tie's source), so
    from_pretrained(dtype=bf16) holds it in bf16. Kept in fp32 by its other name, the embedding's output was fp32
    and the first bf16 Linear refused it (a dtype mismatch); by its first name, the logits equal transformers'."""
    torch.manual_seed(0)
    model = HYV4ForCausalLM(HYV4Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=8, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=8, index_head_dim=8, index_n_heads=2, index_topk=4, tie_word_embeddings=True,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    directory = os.path.join(str(tmp_path), f"rank{st.rank()}")  # as transformers' save: the tie's source only
    model.config.save_pretrained(directory)  # (its save_pretrained writes on rank 0 alone under torchrun)
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                                os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    ref = HYV4ForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, attn_implementation="eager")
    assert ref.model.embed_tokens.weight.dtype == torch.bfloat16
    kept = build_glob_alternation(list(ref._get_dtype_plan(torch.bfloat16)))[0]
    for prefix, m in ref.named_modules():  # buffers outside the plan cast, as strata.torch casts them
        for k, b in m._buffers.items():
            if b is not None and b.is_floating_point() and not kept.search(f"{prefix}.{k}" if prefix else k):
                m._buffers[k] = b.to(torch.bfloat16)
    model.eval(), ref.eval()
    engine = st.shard(model, half_config(3, "bf16"))
    fp32 = [n for u in engine.units if u.spec.fp32 for n in u.spec.names]
    x = inputs("hy_v4")["input_ids"]
    error = None
    try:
        with torch.no_grad():
            got = model(input_ids=x).logits
    except RuntimeError as e:  # checked after the close: every rank fails alike here
        error = e
    engine.close()
    assert "model.embed_tokens.weight" not in fp32 and "lm_head.weight" not in fp32, fp32
    assert error is None, error
    with torch.no_grad():
        want = ref(input_ids=x).logits
    assert torch.equal(got, want), f"largest difference {(got.float() - want.float()).abs().max().item():.3g}"


def test_stage3_update_in_backward_is_refused_at_shard():
    """strata.optimizer_in_backward at stage 3: the kept units' fp32 master is gathered in their backward, which
    the engine refuses once other units are updated there. Refused by st.shard, naming the ways out (before, the
    first backward failed naming a GatherUnit the script never called); stage 2 (a replicated fp32 copy) runs."""
    cfg = half_config(3, "bf16", zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    cfg["strata"]["optimizer_in_backward"] = True
    with pytest.raises(ValueError, match=r"optimizer_in_backward.*stage 3 .*model\.layers\.1\[fp32\].*Use stage 2"):
        st.shard(build("deepseek_v3"), cfg)
    cfg["zero_optimization"]["stage"] = 2
    model = build("deepseek_v3")
    engine = st.shard(model, cfg)
    x = inputs("deepseek_v3", st.rank())["input_ids"]
    model(input_ids=x, labels=x).loss.backward()
    engine.step()
    engine.close()
