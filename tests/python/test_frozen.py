"""Frozen parameters (requires_grad=False): the engine's frozen units. A module with both kinds is two
engine units, hooked together. Checked at this job's world size, ZeRO stages 0-3: the frozen parameters
are bit for bit their initial values after 10 steps and never get a .grad; the trainable ones follow plain
torch (torch.optim.AdamW over the trainable parameters only, same initial values and data) to a
per-tensor relative L2 <= 1e-5, with accumulation and clipping, and with activation checkpointing; the
optimizer tier holds exactly the trainable units' state; full_state_dict has every parameter; a
checkpoint resumes bit for bit."""
import pytest
import torch

import strata.torch as st
from common import LR, WD, config, reference_step, rel_errors, shared_dir
from models import batches, tiny_lm

STEPS = 10
# The tied embedding / LM head, one block's fc1, a whole block and a norm: every unit shape there is
# (root: trainable and frozen parts; blocks.0 and blocks.2: both parts; blocks.1: frozen alone).
FROZEN = ("emb.weight", "blocks.0.fc1.weight", "blocks.0.fc1.bias", "blocks.1.", "blocks.2.norm.")


def is_frozen(name):
    return any(name == f or (f.endswith(".") and name.startswith(f)) for f in FROZEN)


def frozen_lm(**kw):
    m = tiny_lm(**kw)
    for name, p in m.named_parameters():
        p.requires_grad_(not is_frozen(name))
    return m


def reference_optimizer(model):
    """AdamW over the trainable parameters only, decay on 2-D weights (as common.reference_optimizer)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in trainable if p.ndim >= 2], "weight_decay": WD},
                              {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.999), eps=1e-8)


VARIANTS = {"plain": (1, 0.0, None), "accumulate-clip": (2, 0.5, None), "checkpoint": (1, 0.0, "non-reentrant")}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_frozen_untouched_and_trainable_matches_torch(stage, variant):
    accumulation, clip, ckpt = VARIANTS[variant]
    model, ref = frozen_lm(ckpt=ckpt), frozen_lm()
    start = {k: v.clone() for k, v in tiny_lm().state_dict().items()}
    engine = st.shard(model, config(stage, accumulation, clip))
    names = [u.spec.name for u in engine.units]
    assert "root[frozen]" in names and "blocks.0[frozen]" in names and "blocks.1" in names, names
    assert [u.spec.frozen for u in engine.units if u.spec.name == "blocks.1"] == [True]
    opt = reference_optimizer(ref)
    frozen = [p for n, p in model.named_parameters() if is_frozen(n)]
    for step in range(STEPS):
        for m in range(accumulation):
            x, y = batches(step, m, st.rank())
            model(x, y).backward()
            assert all(p.grad is None for p in frozen)
        engine.step()
        reference_step(ref, opt, batches, step, st.world_size(), accumulation, clip)
    state = engine.full_state_dict()
    assert set(state) == set(ref.state_dict())
    assert state["head.weight"] is state["emb.weight"]
    for k in state:
        if is_frozen(k) or k == "head.weight":
            assert torch.equal(state[k], start[k]), f"frozen {k} changed"
        else:
            assert not torch.equal(state[k], start[k]), f"{k} did not train"
    trained = {k: v for k, v in ref.state_dict().items() if not is_frozen(k) and k != "head.weight"}
    errors = rel_errors(state, trained)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    engine.close()


def optimizer_bytes(engine, stage):
    """The pinned-host tier's bytes with offload_optimizer cpu and fp32: the trainable units' fp32 master,
    gradients and Adam m, v (4 bytes each per element), over the unit (P) or the rank's shard (S, P / N):
    stage 1 keeps the full gradient (4 P + 12 S), stages 2-3 shard all four (16 S)."""
    world, total = st.world_size(), 0
    for u in engine.units:
        if u.spec.frozen:
            continue
        align = 16 * world
        padded = (max(u.layout.total, 1) + align - 1) // align * align
        shard = padded // world
        total += 4 * padded + 12 * shard if stage == 1 else 16 * shard
    return total


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_frozen_parameters_have_no_optimizer_memory(stage):
    cfg = config(stage)
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    model = frozen_lm()
    engine = st.shard(model, cfg)
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    engine.step()
    assert engine.stats()["pinned_host_current_bytes"] == optimizer_bytes(engine, stage)
    engine.close()
    everything = tiny_lm()  # the same model, all trainable: more state, by the frozen units' share
    engine = st.shard(everything, cfg)
    assert engine.stats()["pinned_host_current_bytes"] == optimizer_bytes(engine, stage)
    engine.close()


def train(model, engine, first, last):
    losses = []
    for step in range(first, last):
        x, y = batches(step, 0, st.rank())
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        engine.step()
    return losses


@pytest.mark.parametrize("stage", [1, 3])
def test_frozen_save_and_resume(stage, tmp_path):
    root = shared_dir(tmp_path)
    model = frozen_lm()
    engine = st.shard(model, config(stage))
    train(model, engine, 0, 3)
    engine.save_checkpoint(root, {"next_step": 3})
    losses = train(model, engine, 3, 6)
    final = engine.full_state_dict()
    engine.close()

    model2 = frozen_lm(seed=7)  # other initial values, frozen ones too: all of it comes from the checkpoint
    engine2 = st.shard(model2, config(stage))
    assert engine2.load_checkpoint(root) == {"next_step": 3}
    assert train(model2, engine2, 3, 6) == losses
    state = engine2.full_state_dict()
    assert all(torch.equal(state[k], final[k]) for k in final)
    engine2.close()
