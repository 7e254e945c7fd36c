"""Param groups with their own lr and weight decay (docs/decisions/0032-param-groups.md, Note [Param groups]):
strata.torch (shard(lr=, weight_decay=)) and strata.deepspeed (model_parameters groups) against plain torch with
the same param groups (torch.optim.AdamW, Adam with L2 = DeepSpeed's adam_w_mode false, SGD with momentum),
ZeRO stages 0-3, at this job's world size; the per-group lr under DeepSpeed's schedules (WarmupCosineLR: the
group's lr times the ratio; WarmupDecayLR and WarmupLR given warmup_max_lr: that one peak for every group, said
once in the log; WarmupLR without it: each group's own peak) against DeepSpeed's formulas; a resume with another
group lr refused naming the parameter."""
import math

import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from common import LR, WD, config, reference_step, rel_errors, shared_dir
from models import batches, tiny_lm

STEPS = 10
SGD_LR = 0.05
OWN_WD = 0.05  # group "embed": a decay other than the config's


def group_of(name, p):
    """Three groups: the blocks' matrices (the config's lr and decay), every 1-D parameter (3x the lr, no decay),
    the embedding (tied to the head) and the positions (half the lr, a decay of their own)."""
    if name in ("emb.weight", "pos"):
        return "embed"
    return "matrix" if p.ndim >= 2 else "vector"


def optimizer_config(kind):
    if kind == "sgd":
        return {"type": "SGD", "params": {"lr": SGD_LR, "momentum": 0.9, "weight_decay": WD}}
    params = {"lr": LR, "weight_decay": WD, "betas": [0.9, 0.999], "eps": 1e-8}
    if kind == "adam-l2":
        return {"type": "Adam", "params": {**params, "adam_w_mode": False}}
    return {"type": "AdamW", "params": params}


def base_lr(kind):
    return SGD_LR if kind == "sgd" else LR


def own_lrs(kind):
    """Each group's own lr (None: the config's)."""
    return {"matrix": None, "vector": 3 * base_lr(kind), "embed": 0.5 * base_lr(kind)}


def own_wds():
    """Each group's weight decay as strata.torch's weight_decay= takes it: True the config's, 0.0 none, a float."""
    return {"matrix": True, "vector": 0.0, "embed": OWN_WD}


def torch_groups(model, kind):
    """The same groups for a torch optimizer: a group without "lr" / "weight_decay" takes the optimizer's."""
    out = {}
    for n, p in model.named_parameters():
        out.setdefault(group_of(n, p), []).append(p)
    lrs, wds = own_lrs(kind), {"matrix": None, "vector": 0.0, "embed": OWN_WD}
    groups = []
    for g in ("matrix", "vector", "embed"):
        group = {"params": out[g]}
        if lrs[g] is not None:
            group["lr"] = lrs[g]
        if wds[g] is not None:
            group["weight_decay"] = wds[g]
        groups.append(group)
    return groups


def torch_optimizer(model, kind):
    groups = torch_groups(model, kind)
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=SGD_LR, momentum=0.9, weight_decay=WD)
    cls = torch.optim.Adam if kind == "adam-l2" else torch.optim.AdamW
    return cls(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)


def check_trained_alike(state, ref, start):
    errors = rel_errors(state, ref.state_dict())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}"
    assert all(not torch.equal(state[k], start[k]) for k in start)  # training moved every tensor


@pytest.mark.parametrize("kind", ["adamw", "adam-l2", "sgd"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_strata_torch_groups_match_torch(stage, kind):
    cfg = config(stage, optimizer=optimizer_config(kind))
    model, ref = tiny_lm(), tiny_lm()
    lrs, wds = own_lrs(kind), own_wds()
    engine = st.shard(model, cfg, weight_decay=lambda n, p: wds[group_of(n, p)],
                      lr=lambda n, p: lrs[group_of(n, p)])
    opt = torch_optimizer(ref, kind)
    # engine.lr(param): the group's lr (the model's parameters are placeholders now: the groups from ref's)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        want = lrs[group_of(name, q)] or base_lr(kind)
        assert engine.lr(p) == pytest.approx(want, rel=1e-15), name
    assert engine.lr() == base_lr(kind)
    for step in range(STEPS):
        for micro in range(1):
            x, y = batches(step, micro, st.rank())
            model(x, y).backward()
        assert engine.step()["lr"] == base_lr(kind)  # the config's group
        reference_step(ref, opt, batches, step, st.world_size(), 1, 0.0)
    check_trained_alike(engine.full_state_dict(), ref, tiny_lm().state_dict())
    engine.close()


@pytest.mark.parametrize("bad", [torch.tensor(0.5), "0.5", None])
def test_strata_torch_refuses_a_weight_decay_that_is_no_number(bad):
    """A weight_decay= value that is neither a flag nor a number is refused, never read as True (which would decay
    by the config's value: a tensor, a string or None trained silently at the wrong decay before)."""
    with pytest.raises(TypeError, match=r"weight_decay= gives parameter '[^']+' .*; return a float"):
        st.shard(tiny_lm(), config(3), weight_decay=lambda n, p: bad)


def test_strata_torch_numpy_weight_decay_is_the_parameters_own():
    """numpy's floats are numbers: a parameter's own decay, the same bits as the Python float of that value."""
    import numpy as np
    states = []
    for wd in (np.float32(0.5), float(np.float32(0.5)), True):
        model = tiny_lm()
        engine = st.shard(model, config(3), weight_decay=lambda n, p, wd=wd: wd)
        for step in range(2):
            x, y = batches(step, 0, st.rank())
            model(x, y).backward()
            engine.step()
        states.append(engine.full_state_dict())
        engine.close()
    own, same, flag = states
    assert all(torch.equal(own[k], same[k]) for k in own)
    assert any(not torch.equal(own[k], flag[k]) for k in own)  # the config's decay (WD) differs from 0.5


def test_strata_torch_refuses_bad_group_values():
    model = tiny_lm()
    cfg = config(3)
    with pytest.raises(TypeError, match=r"lr= gives parameter '[^']+' 'fast'; return a number"):
        st.shard(model, cfg, lr=lambda n, p: "fast")
    with pytest.raises(ValueError, match=r"lr= gives parameter '[^']+' -0.1; it must be a finite number >= 0"):
        st.shard(tiny_lm(), cfg, lr=lambda n, p: -0.1)
    with pytest.raises(ValueError, match=r"weight_decay= gives parameter '[^']+' nan"):
        st.shard(tiny_lm(), cfg, weight_decay=lambda n, p: float("nan"))
    engine = st.shard(tiny_lm(), cfg, lr=lambda n, p: 2e-3 if n == "pos" else None)
    with pytest.raises(ValueError, match=r"not a parameter of this engine's model"):
        engine.lr(torch.nn.Parameter(torch.zeros(2)))
    engine.close()


def ds_groups(kind):
    """model_parameters as a DeepSpeed script writes them: "lr" / "weight_decay" only where the group has its own."""
    return lambda model: torch_groups(model, kind)


def ds_micro_batch(engine, step, micro):
    x, y = batches(step, micro, st.rank())
    engine.backward(engine(x, y))
    engine.step()


def test_deepspeed_param_groups_show_auto_values_resolved():
    """optimizer.param_groups carry the values the engine runs, "auto" resolved as Hugging Face's integration
    resolves it absent a trainer (betas 0.9, 0.999; eps 1e-8; weight_decay 0.0), never the string "auto"."""
    opt = {"type": "AdamW", "params": {"lr": LR, "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
    model = tiny_lm()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=ds_groups("adamw")(model),
                                                   config=config(3, optimizer=opt))
    for g in optimizer.param_groups:
        assert g["betas"] == (0.9, 0.999) and g["eps"] == 1e-8
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.0, OWN_WD]
    engine.destroy()


@pytest.mark.parametrize("kind", ["adamw", "adam-l2"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_groups_match_torch(stage, kind):
    cfg = config(stage, 2, optimizer=optimizer_config(kind), train_micro_batch_size_per_gpu=2)
    model, ref = tiny_lm(), tiny_lm()
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=ds_groups(kind)(model),
                                                           config=cfg)
    assert scheduler is None
    opt = torch_optimizer(ref, kind)
    want = [g["lr"] for g in opt.param_groups]
    assert want == [LR, 3 * LR, 0.5 * LR]
    for step in range(STEPS):
        # no scheduler: each group's own lr, as torch's
        assert engine.get_lr() == [g["lr"] for g in optimizer.param_groups] == pytest.approx(want, rel=1e-15)
        for micro in range(2):
            ds_micro_batch(engine, step, micro)
        reference_step(ref, opt, batches, step, st.world_size(), 2, 0.0)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [WD, 0.0, OWN_WD]
    check_trained_alike(engine.strata.full_state_dict(), ref, tiny_lm().state_dict())
    engine.destroy()


def cosine_ratio(it, warmup, total, warmup_min_ratio, cos_min_ratio):
    """deepspeed/runtime/lr_schedules.py WarmupCosineLR.get_lr_ratio at last_batch_iteration `it` ("log")."""
    if it < 0:
        return 0.0
    w = max(2, warmup)
    if it < w:
        return warmup_min_ratio + (math.log(it + 1) / math.log(w)) * (1.0 - warmup_min_ratio)
    progress = min(1.0, (it - w + 1) / max(1, total - w))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)


def warmup_gamma(it, warmup, total=None):
    """WarmupLR._get_gamma ("log"), WarmupDecayLR's when total is given, at last_batch_iteration `it`."""
    w = max(2, warmup)
    if it < w:
        return math.log(it + 1) / math.log(w)
    return 1.0 if total is None else max(0.0, (total - it) / max(1.0, total - w))


def test_warmup_cosine_lr_scales_each_groups_lr_as_deepspeed():
    """WarmupCosineLR: each group at org_lr * ratio (DeepSpeed's org_lrs), at every step; the weights are torch's
    with those lrs."""
    sched = {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 3,
                                                  "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}
    cfg = config(3, 1, optimizer=optimizer_config("adamw"), scheduler=sched, train_micro_batch_size_per_gpu=2)
    model, ref = tiny_lm(), tiny_lm()
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=ds_groups("adamw")(model),
                                                           config=cfg)
    opt = torch_optimizer(ref, "adamw")
    org = [g["lr"] for g in opt.param_groups]
    for step in range(STEPS):
        want = [lr * cosine_ratio(step - 1, 3, 8, 0.1, 0.05) for lr in org]
        got = engine.get_lr()
        assert got == pytest.approx(want, rel=1e-12, abs=0), step
        assert scheduler.get_last_lr() == got == [g["lr"] for g in optimizer.param_groups]
        for g, lr in zip(opt.param_groups, want):
            g["lr"] = lr
        ds_micro_batch(engine, step, 0)
        reference_step(ref, opt, batches, step, st.world_size(), 1, 0.0)
    assert engine.get_lr()[1] == pytest.approx(3 * engine.get_lr()[0], rel=1e-12)
    check_trained_alike(engine.strata.full_state_dict(), ref, tiny_lm().state_dict())
    engine.destroy()


@pytest.mark.parametrize("schedule", ["WarmupDecayLR", "WarmupLR-max", "WarmupLR"])
def test_warmup_schedules_give_groups_deepspeeds_peak(schedule, capfd):
    """WarmupDecayLR, and WarmupLR given warmup_max_lr: DeepSpeed's _format_param gives every group that one
    peak, so a group's own lr is unused (said once in rank 0's log). WarmupLR without warmup_max_lr: each group's
    own lr is its peak (warmup_max_lr defaults to [group['lr'] for group in param_groups]). The lrs against the
    formula, the weights against torch run at those lrs (the groups' own weight decay still applies)."""
    params = {"warmup_min_lr": 1e-5, "warmup_num_steps": 3}
    if schedule != "WarmupLR":
        params["warmup_max_lr"] = 2 * LR
    if schedule == "WarmupDecayLR":
        params["total_num_steps"] = 8
    sched = {"type": schedule.split("-")[0], "params": params}
    cfg = config(2, 1, optimizer=optimizer_config("adamw"), scheduler=sched, train_micro_batch_size_per_gpu=2)
    model, ref = tiny_lm(), tiny_lm()
    capfd.readouterr()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=ds_groups("adamw")(model), config=cfg)
    opt = torch_optimizer(ref, "adamw")
    err = capfd.readouterr().err
    logged = "every parameter's lr rises to warmup_max_lr 0.002, as DeepSpeed gives every param group that one value"
    assert (logged in err) == (schedule != "WarmupLR" and st.rank() == 0), err
    if logged in err:
        assert "the own lr of " in err and "is not used" in err
    peaks = [2 * LR] * 3 if schedule != "WarmupLR" else [LR, 3 * LR, 0.5 * LR]
    for step in range(STEPS):
        gamma = 0.0 if step == 0 else warmup_gamma(step - 1, 3, 8 if schedule == "WarmupDecayLR" else None)
        want = [1e-5 + (peak - 1e-5) * gamma for peak in peaks]
        assert engine.get_lr() == pytest.approx(want, rel=1e-12), step
        for g, lr in zip(opt.param_groups, want):  # torch with the lrs DeepSpeed's schedule gives each group
            g["lr"] = lr
        ds_micro_batch(engine, step, 0)
        reference_step(ref, opt, batches, step, st.world_size(), 1, 0.0)
    check_trained_alike(engine.strata.full_state_dict(), ref, tiny_lm().state_dict())
    engine.destroy()


def test_resume_with_another_group_lr_is_refused(tmp_path):
    root = shared_dir(tmp_path)
    cfg = config(3, 1, optimizer=optimizer_config("adamw"), train_micro_batch_size_per_gpu=2)

    def make(vector_lr):
        model = tiny_lm()
        groups = torch_groups(model, "adamw")
        groups[1]["lr"] = vector_lr
        return deepspeed.initialize(model=model, model_parameters=groups, config=cfg)[0]

    engine = make(3 * LR)
    for step in range(2):
        ds_micro_batch(engine, step, 0)
    engine.save_checkpoint(root, tag="t")
    lrs = engine.get_lr()
    engine.destroy()
    same = make(3 * LR)
    same.load_checkpoint(root, tag="t")
    assert same.get_lr() == lrs and same.global_steps == 2
    same.destroy()
    other = make(4 * LR)
    with pytest.raises(st.StrataError, match=r"was saved with other optimizer settings for this model: "
                       r"parameter '[^']+' has its own lr 0.004 here but 0.003 in the checkpoint"):
        other.load_checkpoint(root, tag="t")
    other.destroy()


def test_group_values_the_engine_cannot_honour_are_refused():
    def two(extra):
        return lambda m: [{"params": [p for p in m.parameters() if p.ndim >= 2]},
                          {"params": [p for p in m.parameters() if p.ndim < 2], **extra}]

    def make(groups):
        model = tiny_lm()
        return deepspeed.initialize(model=model, model_parameters=groups(model), config=config(3))

    with pytest.raises(ValueError, match=r"param group 1 has its own betas \(\(0.8, 0.9\)\).*Per-group betas is not "
                                         r"supported \(per-group lr and weight_decay are\)"):
        make(two({"betas": (0.8, 0.9)}))
    with pytest.raises(ValueError, match=r"param group 1 has lr -0.5; it must be a finite number >= 0"):
        make(two({"lr": -0.5}))
    with pytest.raises(ValueError, match=r"param group 1 has weight_decay 'x'; it must be a finite number >= 0"):
        make(two({"weight_decay": "x"}))
