"""What strata.deepspeed.initialize returns as the optimizer and the lr scheduler: views of the engine, which owns
the optimizer (its state sharded over the ranks) and applies the config's scheduler itself at every step.

They carry what training scripts read (optimizer.param_groups[i]["lr"], scheduler.get_last_lr()) and turn what
they would change behind the engine's back into errors naming the config key to use instead."""
from strata.deepspeed import _groups

_OWNED = ("strata.deepspeed: the optimizer's state lives in the engine, sharded over the ranks; "
          "engine.save_checkpoint() / load_checkpoint() save and restore it")


class EngineOptimizer:
    """engine.optimizer. param_groups are the groups given to initialize, each with its lr as the engine's schedule
    gives it (updated after every optimizer step), betas, eps and weight_decay: the group's own, else the
    config's as the engine resolved it ("auto" filled in)."""

    def __init__(self, engine, groups, optimizer_params):
        self._engine = engine
        self.param_groups = []
        resolved = engine.strata.resolved  # the config's values with "auto" filled in, as the engine runs them
        defaults = {"betas": (float(resolved["optimizer.params.betas[0]"]),
                              float(resolved["optimizer.params.betas[1]"])),
                    "eps": float(resolved["optimizer.params.eps"]),
                    "momentum": float(resolved["optimizer.params.momentum"]),
                    "weight_decay": float(resolved["optimizer.params.weight_decay"])}
        for g in groups:
            group = {k: v for k, v in defaults.items() if k in optimizer_params or k != "momentum"}
            group.update({k: v for k, v in g.items() if k != "lr"})
            self.param_groups.append(group)
        self._own_lrs = [_groups.group_own_lr(i, g) for i, g in enumerate(groups)]  # None: the config's
        self._lrs = None
        self.update_lrs()

    def lrs(self):
        """Each group's lr for the next optimizer step: the engine's schedule applied to the group's own lr or the
        config's, by DeepSpeed's rule (Note [Param groups], strata_engine_group_lr)."""
        return [self._engine.strata.group_lr(own) for own in self._own_lrs]

    def update_lrs(self):
        self._lrs = self.lrs()
        for g, lr in zip(self.param_groups, self._lrs):
            g["lr"] = lr

    def check_lr_untouched(self):
        """Before an optimizer step: a script that wrote param_groups[i]["lr"] (its own schedule) would train
        with the engine's lr, not its own; refused."""
        for i, (g, lr) in enumerate(zip(self.param_groups, self._lrs)):
            if g.get("lr") != lr:
                raise RuntimeError(f"strata.deepspeed: optimizer.param_groups[{i}]['lr'] was changed to {g.get('lr')} "
                                   f"(the engine's is {lr}); the engine takes its lr from the config's `scheduler` "
                                   f"(WarmupLR, WarmupDecayLR, WarmupCosineLR) and `optimizer.params.lr`, so set "
                                   f"the schedule there instead of writing the lr")

    @property
    def state(self):
        raise RuntimeError(_OWNED)

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    def step(self, closure=None):
        raise RuntimeError("strata.deepspeed: call engine.step() after each micro-batch's engine.backward(loss); "
                           "it updates the parameters at the gradient accumulation boundary (optimizer.step() "
                           "would bypass the engine)")

    def state_dict(self):
        raise RuntimeError(_OWNED)

    def load_state_dict(self, state_dict):
        raise RuntimeError(_OWNED)


class EngineScheduler:
    """engine.lr_scheduler, when the config has a `scheduler`: the engine steps it at every optimizer step, so
    step() is a no-op (as accelerate's DeepSpeed scheduler wrapper); get_last_lr() / get_lr() are the lr the
    next optimizer step uses, one per param group, as DeepSpeed's schedulers keep it."""

    def __init__(self, engine):
        self._engine = engine

    def step(self, *args, **kwargs):
        pass

    def get_last_lr(self):
        return self._engine.get_lr()

    def get_lr(self):
        return self._engine.get_lr()

    @property
    def last_batch_iteration(self):
        return self._engine.global_steps - 1

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state_dict):
        if state_dict.get("last_batch_iteration") != self.last_batch_iteration:
            raise RuntimeError(f"strata.deepspeed: the lr schedule follows the engine's optimizer steps "
                               f"({self._engine.global_steps} so far) and cannot be set apart from them; "
                               f"engine.load_checkpoint() restores both")
