"""strata.deepspeed's engine loop: engine.step() after every micro-batch with the update at the accumulation
boundary, get_lr() / the optimizer's and the scheduler's lr, param groups, zero_grad, the dataloader and the
ways to pass the config."""
import json
import os

import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from common import LR, WD, config, shared_dir, world
from models import batches, tiny_lm

SCHEDULE = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": 3}}


def ds_config(stage=3, accumulation=4, **extra):
    return config(stage, accumulation, train_micro_batch_size_per_gpu=2, **extra)


def make(cfg=None, model_parameters=None, **kw):
    model = tiny_lm()
    params = model.parameters() if model_parameters is None else model_parameters(model)
    return deepspeed.initialize(model=model, model_parameters=params, config=cfg or ds_config(), **kw)


def micro_batch(engine, step, micro):
    x, y = batches(step, micro, st.rank())
    loss = engine(x, y)
    engine.backward(loss)
    return loss.item()


def test_step_after_every_micro_batch_updates_at_the_boundary():
    engine, optimizer, _, scheduler = make()
    assert (engine.gradient_accumulation_steps(), engine.train_micro_batch_size_per_gpu()) == (4, 2)
    assert engine.train_batch_size() == 2 * 4 * st.world_size()
    assert scheduler is None and optimizer is engine.optimizer
    before = engine.module.state_dict()
    for step in range(2):
        for micro in range(4):
            assert engine.is_gradient_accumulation_boundary() == (micro == 3)
            micro_batch(engine, step, micro)
            engine.step()
            state = engine.module.state_dict()
            changed = any(not torch.equal(state[k], before[k]) for k in before)
            assert changed == (micro == 3), (step, micro)
            assert engine.was_step_applied() == (micro == 3)
            before = state
            assert engine.global_steps == step + (micro == 3)
            assert engine.micro_steps == 4 * step + micro + 1
    assert engine.global_samples == 2 * engine.train_batch_size()
    assert engine.get_global_grad_norm() > 0
    engine.destroy()


def test_step_without_its_backward_is_refused():
    engine, *_ = make(ds_config(accumulation=2))
    with pytest.raises(RuntimeError, match=r"micro-batch 1 of 2 .* but 0 backward passes"):
        engine.step()
    micro_batch(engine, 0, 0)
    micro_batch(engine, 0, 1)
    with pytest.raises(RuntimeError, match=r"micro-batch 1 of 2 .* but 2 backward passes"):
        engine.step()
    engine.strata.step()  # the two passes make a whole step for the engine underneath
    engine.destroy()


def test_backward_returns_the_loss_over_the_accumulation():
    engine, *_ = make()
    x, y = batches(0, 0, st.rank())
    loss = engine(x, y)
    assert torch.equal(engine.backward(loss), loss.detach() / 4)
    for micro in range(1, 4):
        engine.step()
        micro_batch(engine, 0, micro)
    engine.step()
    engine.destroy()


def test_get_lr_is_the_lr_of_the_next_step_for_every_group():
    groups = lambda m: [{"params": [p for p in m.parameters() if p.ndim >= 2]},  # noqa: E731
                        {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    engine, optimizer, _, scheduler = make(ds_config(accumulation=1, scheduler=SCHEDULE), groups)
    ref_model = tiny_lm()
    ref = st.shard(ref_model, ds_config(accumulation=1, scheduler=SCHEDULE))
    seen = []
    for step in range(4):
        lr = engine.get_lr()
        assert len(lr) == 2 and lr[0] == lr[1]
        assert [g["lr"] for g in optimizer.param_groups] == lr == scheduler.get_last_lr() == scheduler.get_lr()
        assert scheduler.state_dict() == {"last_batch_iteration": step - 1}
        scheduler.step()  # the engine steps the schedule: a no-op, as accelerate's wrapper
        assert engine.get_lr() == lr
        micro_batch(engine, step, 0)
        engine.step()
        x, y = batches(step, 0, st.rank())
        ref_model(x, y).backward()
        assert ref.step()["lr"] == lr[0]
        seen.append(lr[0])
    assert seen[0] < seen[-1] == LR  # the warm-up
    assert optimizer.param_groups[0]["weight_decay"] == WD and optimizer.param_groups[1]["weight_decay"] == 0.0
    engine.destroy()
    ref.close()


def train_two_steps(engine):
    for step in range(2):
        for micro in range(2):
            micro_batch(engine, step, micro)
            engine.step()
    return engine.strata.full_state_dict()


def strata_torch_two_steps(cfg, weight_decay):
    model = tiny_lm()
    engine = st.shard(model, cfg, weight_decay=weight_decay)
    for step in range(2):
        for micro in range(2):
            x, y = batches(step, micro, st.rank())
            model(x, y).backward()
        engine.step()
    state = engine.full_state_dict()
    engine.close()
    return state


@pytest.mark.parametrize("groups", ["plain", "named", "split", "named-split"])
def test_param_groups_set_the_weight_decay_per_parameter(groups):
    """model.parameters(): every parameter decays (DeepSpeed's rule, biases and norms too); groups with
    weight_decay 0.0 leave theirs undecayed. (name, parameter) pairs, as torch's optimizers take them since 2.5,
    mean their parameters."""
    cfg = ds_config(accumulation=2)
    if groups == "plain":
        params, decays = None, (lambda name, p: True)
    elif groups == "named":
        params, decays = (lambda m: list(m.named_parameters())), (lambda name, p: True)
    elif groups == "named-split":
        params = lambda m: [{"params": [(n, p) for n, p in m.named_parameters() if p.ndim >= 2]},  # noqa: E731
                            {"params": [(n, p) for n, p in m.named_parameters() if p.ndim < 2], "weight_decay": 0.0}]
        decays = lambda name, p: p.ndim >= 2  # noqa: E731
    else:
        params = lambda m: [{"params": [p for p in m.parameters() if p.ndim >= 2], "weight_decay": WD},  # noqa: E731
                            {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0}]
        decays = lambda name, p: p.ndim >= 2  # noqa: E731
    engine, *_ = make(cfg, params)
    state = train_two_steps(engine)
    engine.destroy()
    expected = strata_torch_two_steps(cfg, decays)
    assert all(torch.equal(state[k], v) for k, v in expected.items())


def test_param_groups_the_engine_cannot_honour_are_refused():
    def two(extra):
        return lambda m: [{"params": [p for p in m.parameters() if p.ndim >= 2]},
                          {"params": [p for p in m.parameters() if p.ndim < 2], **extra}]
    # (a group's own lr and weight_decay are honoured: tests/python/test_param_groups.py)
    with pytest.raises(ValueError, match=r"param group 1 has its own eps \(0.001\).*Per-group eps is not supported"):
        make(model_parameters=two({"eps": 1e-3}))
    with pytest.raises(ValueError, match=r"param group 1 has the key 'amsgrad'"):
        make(model_parameters=two({"amsgrad": True}))
    with pytest.raises(ValueError, match=r"parameter 'norm.weight' requires grad but is in no group"):
        make(model_parameters=lambda m: [p for n, p in m.named_parameters() if n != "norm.weight"])
    with pytest.raises(ValueError, match=r"is in param groups 0 and 1"):
        make(model_parameters=lambda m: [{"params": list(m.parameters())}, {"params": [m.norm.weight]}])
    # the config's own values in a group are honoured
    engine, *_ = make(model_parameters=two({"lr": LR, "betas": (0.9, 0.999), "weight_decay": WD}))
    engine.destroy()


def test_zero_grad_inside_an_accumulation_window():
    """ZeRO-2/3: a no-op, as DeepSpeed's there; stages 0-1: refused (DeepSpeed would drop the gradients)."""
    for stage in (3, 1):
        engine, optimizer, *_ = make(ds_config(stage, accumulation=2))
        engine.zero_grad()
        micro_batch(engine, 0, 0)
        engine.step()
        if stage == 3:
            engine.zero_grad()
            optimizer.zero_grad()
        else:
            with pytest.raises(RuntimeError, match=r"zero_grad\(\) after 1 of 2 micro-batches at ZeRO stage 1"):
                engine.zero_grad()
        micro_batch(engine, 0, 1)
        engine.step()
        engine.zero_grad()
        engine.destroy()


def test_config_from_args_path_or_config_params(tmp_path):
    path = os.path.join(shared_dir(tmp_path), "ds_config.json")
    if st.rank() == 0:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(ds_config(accumulation=3), f)
    world().Barrier()

    class Args:
        deepspeed_config = path

    engine, *_ = deepspeed.initialize(args=Args(), model=tiny_lm())
    assert engine.gradient_accumulation_steps() == 3
    engine.destroy()
    model = tiny_lm()
    engine, *_ = deepspeed.initialize(model=model, config_params=ds_config(accumulation=2))
    assert engine.gradient_accumulation_steps() == 2
    engine.destroy()
    with pytest.raises(ValueError, match="both as args.deepspeed_config and as config="):
        deepspeed.initialize(args=Args(), model=tiny_lm(), config=ds_config())


def test_training_data_gives_each_rank_micro_batches_of_its_share():
    data = torch.utils.data.TensorDataset(torch.arange(64))
    engine, _, loader, _ = make(training_data=data)
    seen = torch.cat([b[0] for b in loader])
    assert all(len(b[0]) == 2 for b in loader)
    everything = torch.cat(world().allgather(seen))
    assert sorted(everything.tolist()) == list(range(64))  # 64 divides over 1, 2 or 4 ranks
    engine.destroy()


def test_gathered_parameters_edit_lands_in_the_engine():
    engine, *_ = make(ds_config(accumulation=1))
    assert deepspeed.zero.GatheredParameters is st.GatheredParameters
    with deepspeed.zero.GatheredParameters(engine.module.norm.bias, modifier_rank=0), torch.no_grad():
        if st.rank() == 0:
            engine.module.norm.bias.fill_(0.25)
    assert torch.equal(engine.module.state_dict()["norm.bias"], torch.full((16,), 0.25))
    engine.destroy()


def test_a_parameter_without_a_gradient_is_updated_as_deepspeed_does():
    """DeepSpeed's rule (a zero gradient: decayed) unless the config asks for torch's (skipped)."""
    for rule in (None, "skip"):
        model = tiny_lm()
        model.unused = torch.nn.Linear(16, 16)  # in the root unit, never used by the forward
        start = model.unused.weight.detach().clone()
        cfg = ds_config(accumulation=1)
        if rule is not None:
            cfg["strata"]["params_without_grad"] = rule
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        micro_batch(engine, 0, 0)
        engine.step()
        after = engine.module.state_dict()["unused.weight"]
        assert torch.equal(after, start) == (rule == "skip")
        if rule is None:
            assert torch.allclose(after, start * (1 - LR * WD))  # only the decay moved it
        engine.destroy()


def test_batch_sizes_from_the_config():
    cfg = ds_config(accumulation=2)
    del cfg["train_micro_batch_size_per_gpu"]
    cfg["train_batch_size"] = 3 * 2 * st.world_size()
    engine, *_ = make(cfg)
    assert engine.train_micro_batch_size_per_gpu() == 3 and engine.train_batch_size() == 6 * st.world_size()
    engine.destroy()
    cfg = ds_config(accumulation=2)  # "auto", as Hugging Face's Trainer leaves it: the engine resolves it
    cfg["train_batch_size"] = "auto"
    engine, *_ = make(cfg)
    micro = engine.train_micro_batch_size_per_gpu()
    assert engine.train_batch_size() == micro * 2 * st.world_size()
    assert engine.train_batch_size() == int(engine.strata.resolved["train_batch_size"])
    engine.destroy()
