"""What strata.deepspeed cannot do exactly is refused with the fix named, never done approximately: a torch
optimizer or scheduler object, per-group hyperparameters (test_deepspeed_loop), an lr written into
the optimizer's groups, partial checkpoint loads, and the calls that would bypass the engine."""
import pytest
import torch

import strata.deepspeed as deepspeed
import strata.torch as st
from common import config
from models import batches, tiny_lm


def make(cfg=None):
    model = tiny_lm()
    return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                config=cfg or config(3, 1, train_micro_batch_size_per_gpu=2))


def test_a_torch_optimizer_or_scheduler_is_refused_with_the_config_entry():
    model = tiny_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    entry = r'"optimizer": \{"type": "AdamW", "params": \{"lr": 0.001, "betas": \[0.9, 0.95\], "eps": 1e-08, ' \
            r'"weight_decay": 0.1\}\}'
    with pytest.raises(TypeError, match=r"put it in the config instead: " + entry):
        deepspeed.initialize(model=model, optimizer=opt, config=config(3))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(TypeError, match=r"lr_scheduler= \(LambdaLR\) is refused.*put it in the config"):
        deepspeed.initialize(model=model, lr_scheduler=sched, config=config(3))
    with pytest.raises(TypeError, match=r"optimizer= \(function\) is refused"):
        deepspeed.initialize(model=model, optimizer=lambda params: opt, config=config(3))


def test_calls_that_would_bypass_the_engine():
    engine, optimizer, _, _ = make()
    with pytest.raises(RuntimeError, match=r"call engine.step\(\) after each micro-batch"):
        optimizer.step()
    with pytest.raises(RuntimeError, match=r"the optimizer's state lives in the engine"):
        optimizer.state_dict()
    with pytest.raises(NotImplementedError, match=r"load_optimizer_states=False is not supported"):
        engine.load_checkpoint("/nonexistent", load_optimizer_states=False)
    with pytest.raises(NotImplementedError, match=r"exclude_frozen_parameters=True is not supported"):
        engine.save_checkpoint("/nonexistent", exclude_frozen_parameters=True)
    with pytest.raises(NotImplementedError, match=r"no_sync\(\) is not supported"):
        engine.no_sync()
    with pytest.raises(RuntimeError, match=r"set_gradient_accumulation_boundary\(False\) at micro-batch 1 of 1"):
        engine.set_gradient_accumulation_boundary(False)
    engine.set_gradient_accumulation_boundary(True)  # what the engine does anyway
    x, y = batches(0, 0, st.rank())
    engine.backward(engine(x, y))
    with pytest.raises(NotImplementedError, match=r"lr_kwargs"):
        engine.step(lr_kwargs={"lr": 1.0})
    lr = optimizer.param_groups[0]["lr"]
    optimizer.param_groups[0]["lr"] = 0.5  # a hand-written schedule would be ignored: refused at the step
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['lr'\] was changed to 0.5.*config's `scheduler`"):
        engine.step()
    optimizer.param_groups[0]["lr"] = lr
    engine.step()
    assert engine.global_steps == 1
    engine.destroy()


def test_backward_and_step_need_an_optimizer_in_the_config():
    cfg = config(3, 1)
    del cfg["optimizer"]
    engine, optimizer, _, scheduler = make(cfg)
    assert optimizer is None and scheduler is None
    x, y = batches(0, 0, st.rank())
    with pytest.raises(RuntimeError, match=r"backward\(\) needs an optimizer: put one in the config"):
        engine.backward(engine(x, y))
    engine.destroy()
