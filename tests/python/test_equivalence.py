"""strata.torch against plain single-process torch (torch.optim.AdamW, same initial values and data):
per-tensor relative L2 <= 1e-5 after 10 steps, at this job's world size, for ZeRO stages 0-3, with the tied
embedding / LM head, gradient accumulation with clipping, and activation checkpointing (both kinds)."""
import pytest
import torch

import strata.torch as st
from common import config, reference_optimizer, reference_step, rel_errors, strata_step
from models import batches, tiny_lm

STEPS = 10
VARIANTS = {  # name: (accumulation, clip, checkpointing, block order)
    "plain": (1, 0.0, None, None),
    "accumulate-clip": (2, 0.5, None, None),
    "checkpoint-reentrant": (1, 0.0, "reentrant", None),
    "checkpoint-nonreentrant": (2, 0.0, "non-reentrant", None),
    "block-used-twice": (1, 0.0, None, [0, 1, 2, 1]),  # a unit with two uses (a tied unit)
    "block-used-twice-reentrant": (1, 0.0, "reentrant", [0, 1, 2, 1]),
}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_torch(stage, variant):
    accumulation, clip, ckpt, order = VARIANTS[variant]
    model, ref = tiny_lm(ckpt=ckpt, order=order), tiny_lm(order=order)
    assert model.head.weight is model.emb.weight
    engine = st.shard(model, config(stage, accumulation, clip))
    opt = reference_optimizer(ref)
    clipped = 0
    for step in range(STEPS):
        result, _ = strata_step(model, engine, batches, step, accumulation)
        reference_step(ref, opt, batches, step, st.world_size(), accumulation, clip)
        clipped += result["clip_coef"] < 1.0
    assert (engine.tracker.recomputed > 0) == (ckpt is not None)
    if clip > 0:
        assert clipped > 0, "the clipping threshold never applied: the test would not test clipping"
    state = engine.full_state_dict()
    assert set(state) == set(ref.state_dict())
    assert state["head.weight"] is state["emb.weight"]
    errors = rel_errors(state, ref.state_dict())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    # and training moved every tensor (else equality would prove nothing)
    start = tiny_lm().state_dict()
    assert all(not torch.equal(state[k], start[k]) for k in start)
    engine.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_to_cpu_matches_torch(stage):
    """The config passes through: optimizer state and (stage 3) parameter shards on the pinned-host tier."""
    cfg = config(stage)
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if stage == 3:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, cfg)
    opt = reference_optimizer(ref)
    for step in range(STEPS):
        strata_step(model, engine, batches, step, 1)
        reference_step(ref, opt, batches, step, st.world_size(), 1, 0.0)
    assert engine.stats()["pinned_host_peak_bytes"] > 0
    errors = rel_errors(engine.full_state_dict(), ref.state_dict())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    engine.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_release_idle_memory_matches_torch_and_itself(stage):
    """strata.release_idle_memory (docs/decisions/0021): the gradient memory handed back after each step
    and faulted in again by the next backward trains as torch does, and bit for bit as without the key,
    with accumulation and clipping (the handed-back shards must read as zero for the next step). The
    bitwise comparison at width 128, where each unit spans whole pages (so pages are handed back, not only
    zeroed), and where fp32 rounding puts torch itself beyond 1e-5 of the engine."""
    def train(width, idle, ref=None):
        cfg = config(stage, 2, 0.5)
        cfg["strata"]["release_idle_memory"] = idle
        model = tiny_lm(d=width)
        engine = st.shard(model, cfg)
        opt = reference_optimizer(ref) if ref is not None else None
        for step in range(STEPS):
            strata_step(model, engine, batches, step, 2)
            if ref is not None:
                reference_step(ref, opt, batches, step, st.world_size(), 2, 0.5)
        state = engine.full_state_dict()
        engine.close()
        return state

    ref = tiny_lm()
    errors = rel_errors(train(16, True, ref), ref.state_dict())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    kept, given = train(128, False), train(128, True)
    assert all(torch.equal(kept[k], given[k]) for k in kept), "release_idle_memory changed the weights"
    start = tiny_lm(d=128).state_dict()
    assert all(not torch.equal(given[k], start[k]) for k in start)


@pytest.mark.parametrize("order", [None, [0, 1, 2, 1]])
def test_release_idle_memory_trims_the_heap_once_every_block_has_ended(order):
    """Note [Trimmed heap] (python/strata/torch/_hooks.py): with strata.release_idle_memory the C library's
    heap is trimmed once per micro-batch, after the last block's last backward use and before the root's
    backward ends; never without the key. A block used twice ends only at its second backward use."""
    for idle in (False, True):
        cfg = config(3, 2, 0.0)
        cfg["strata"]["release_idle_memory"] = idle
        model = tiny_lm(order=order)
        engine = st.shard(model, cfg)
        tracker, calls = engine.tracker, []
        if not idle:
            assert tracker.trim_heap is None
        else:
            trim = tracker.trim_heap
            assert trim is not None, "glibc's malloc_trim not found"

            def recording(pad):
                calls.append((all(b.backward_uses == b.forward_uses for b in tracker.blocks),
                              all(r.backward_open for r in engine.roots)))
                return trim(pad)
            tracker.trim_heap = recording
        for step in range(2):
            strata_step(model, engine, batches, step, 2)
        engine.close()
        assert calls == ([(True, True)] * 4 if idle else [])
