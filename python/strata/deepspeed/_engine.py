"""strata.deepspeed's engine: DeepSpeed's training loop (engine(x), engine.backward(loss), engine.step() after
every micro-batch, tagged checkpoints) on a strata.torch engine, which it drives as strata.torch's own loop
does: each backward is loss.backward() (the engine averages the gradients over the ranks and the
gradient_accumulation_steps micro-batches, as DeepSpeed's loss / gas does), and the optimizer step is
strata.torch's step() at the accumulation boundary. So a script's losses and weights are strata.torch's, bit
for bit."""
import os

import torch

from strata import _comm
from strata.deepspeed import _checkpoint
from strata.deepspeed._optim import EngineOptimizer, EngineScheduler


# The engines whose asynchronous save's `latest` file is still to be written (by _finish_async_save): held here so
# that a script dropping one without destroy() does not lose it. Once collected, an engine is destroyed without its
# before-close callbacks (Note [Dropped engines] in strata._comm); held, it waits for the exit, which closes it.
_latest_due = set()


class DeepSpeedEngine(torch.nn.Module):
    """Made by strata.deepspeed.initialize. `engine.module` is the model (its forward hooked by strata.torch);
    `engine.strata` the strata.torch engine under it."""

    def __init__(self, model, strata_engine, config, groups, optimizer_params):
        super().__init__()
        self.module = model
        self.strata = strata_engine
        self._pending_latest = None  # (save_dir, tag) of an asynchronous save in flight, for its latest file
        # destroy(), or the interpreter's exit (which closes every engine), writes it too: a script whose last call
        # is an asynchronous save must leave `latest` naming that tag
        strata_engine.before_close = [self._finish_async_save]
        self.config = config
        self._stage = int(config.get("zero_optimization", {}).get("stage", 0))  # DeepSpeed's default: 0
        self.global_steps = strata_engine.stats()["steps"]
        self.global_samples = 0
        self.skipped_steps = 0
        self.micro_steps = self.global_steps * self.gradient_accumulation_steps()
        self._global_grad_norm = None
        self._step_applied = False
        self.optimizer = EngineOptimizer(self, groups, optimizer_params) if "optimizer" in config else None
        self.lr_scheduler = EngineScheduler(self) if "scheduler" in config else None
        self.training_dataloader = None

    def __getattr__(self, name):
        """As DeepSpeed's engine: attributes it lacks come from the model (model.config, generate, ...)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None or name.startswith("__"):
                raise
            return getattr(module, name)

    # ---- the loop ----
    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _need_optimizer(self, what):
        if self.optimizer is None:
            raise RuntimeError(f"strata.deepspeed: {what} needs an optimizer: put one in the config "
                               f"(\"optimizer\": {{\"type\": \"AdamW\", \"params\": {{\"lr\": ...}}}})")

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """loss.backward() into the engine; returns loss / gradient_accumulation_steps as DeepSpeed does. The
        engine averages over the micro-batches (DeepSpeed's division of the loss by them); scale_wrt_gas=False
        (gradients summed over the micro-batches) multiplies the loss by their number first."""
        self._need_optimizer("backward()")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"strata.deepspeed: backward() takes the scalar loss tensor, got "
                            f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        gas = self.gradient_accumulation_steps()
        # strata.torch's backward: with fp16 the loss is multiplied by the loss scale first, as DeepSpeed's is
        self.strata.backward(loss if scale_wrt_gas else loss * gas, retain_graph=retain_graph)
        return loss.detach() / gas if scale_wrt_gas else loss.detach()

    def is_gradient_accumulation_boundary(self):
        """True while the current micro-batch is the last of its optimizer step (before its engine.step())."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary):
        if bool(is_boundary) != self.is_gradient_accumulation_boundary():
            raise RuntimeError(f"strata.deepspeed: set_gradient_accumulation_boundary({is_boundary}) at micro-batch "
                               f"{self.micro_steps % self.gradient_accumulation_steps() + 1} of "
                               f"{self.gradient_accumulation_steps()}: the engine updates after exactly "
                               f"gradient_accumulation_steps micro-batches; set that key in the config instead")

    def step(self, lr_kwargs=None):
        """After every micro-batch's backward: counts it; at the accumulation boundary runs the optimizer step
        (strata.torch's step()) and then the config's lr schedule advances, as DeepSpeed's step()."""
        self._need_optimizer("step()")
        if lr_kwargs is not None:
            raise NotImplementedError("strata.deepspeed: step(lr_kwargs=...) feeds DeepSpeed's legacy schedulers; "
                                      "the engine's lr comes from the config's `scheduler`")
        gas = self.gradient_accumulation_steps()
        expected = self.micro_steps % gas + 1
        if self.strata.micro_batches != expected:
            raise RuntimeError(f"strata.deepspeed: engine.step() comes once after each micro-batch's backward; this "
                               f"is micro-batch {expected} of {gas} of the optimizer step, but "
                               f"{self.strata.micro_batches} backward passes were done since the last update")
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            if self.optimizer is not None:
                self.optimizer.check_lr_untouched()
            r = self.strata.step()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.skipped_steps += int(bool(r["skipped"]))
            self._step_applied = not r["skipped"]
            self._global_grad_norm = r["grad_norm"]
            self.optimizer.update_lrs()
        self.micro_steps += 1

    def zero_grad(self):
        """DeepSpeed sets every .grad to None. Between optimizer steps there is nothing to drop (the engine
        zeroes its gradients at each step). Inside an accumulation window ZeRO-2/3 hold the gradients in their
        own partitions, so DeepSpeed's zero_grad changes nothing there and neither does this one; at stages 0-1
        DeepSpeed would drop the micro-batches accumulated so far, which the engine (its gradients already
        reduced) cannot: refused."""
        if self.strata.micro_batches == 0:
            self.strata.zero_grad()
        elif self._stage < 2:
            raise RuntimeError(f"strata.deepspeed: zero_grad() after {self.strata.micro_batches} of "
                               f"{self.gradient_accumulation_steps()} micro-batches at ZeRO stage {self._stage}: "
                               f"DeepSpeed would drop their gradients, which the engine has already reduced. Call "
                               f"it only after the engine.step() that ends an accumulation window")

    def no_sync(self):
        raise NotImplementedError("strata.deepspeed: no_sync() is not supported (the engine reduces every "
                                  "micro-batch's gradients as they are made); accumulation is the config's "
                                  "gradient_accumulation_steps")

    # ---- what the loop reads ----
    def gradient_accumulation_steps(self):
        return self.strata.accumulation

    def train_micro_batch_size_per_gpu(self):
        """The engine's resolved value: derived from train_batch_size as DeepSpeed derives it, "auto" filled in."""
        return int(self.strata.resolved["train_micro_batch_size_per_gpu"])

    def train_batch_size(self):
        return int(self.strata.resolved["train_batch_size"])

    def get_lr(self):
        """The lr the next optimizer step uses, one per param group (DeepSpeed reads its optimizer's groups): each
        group's own lr or the config's, under the config's schedule."""
        return self.optimizer.lrs() if self.optimizer is not None else [self.strata.lr()]

    def get_global_grad_norm(self):
        return self._global_grad_norm

    def was_step_applied(self):
        return self._step_applied

    @property
    def world_size(self):
        return _comm.world_size()

    @property
    def dp_world_size(self):
        return _comm.world_size()

    @property
    def global_rank(self):
        return _comm.rank()

    @property
    def local_rank(self):
        return int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))

    @property
    def device(self):
        return self.strata.device

    # ---- checkpoints ----
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False, async_save=False):
        """Collective: save_dir/<tag>/ (default tag 'global_step<N>'), and save_dir/latest naming the tag.
        async_save=True (Strata's; DeepSpeed's save_checkpoint has no such argument) writes the same files in the
        background (docs/decisions/0036-async-checkpoints.md); save_dir/latest then names the tag once it is
        complete, written by the next save_checkpoint(), wait_checkpoint(), load_checkpoint() or destroy(), or at
        the script's exit."""
        if not save_dir:
            raise ValueError(f"strata.deepspeed.save_checkpoint: save_dir must be a non-empty path, got {save_dir!r}")
        if exclude_frozen_parameters:
            raise NotImplementedError("strata.deepspeed.save_checkpoint: exclude_frozen_parameters=True is not "
                                      "supported; the checkpoint holds every parameter, frozen ones included")
        save_dir = os.fspath(save_dir)
        tag = _checkpoint.check_tag(f"global_step{self.global_steps}" if tag is None else tag)
        state = {_checkpoint.KEY: {"global_steps": self.global_steps, "global_samples": self.global_samples,
                                   "skipped_steps": self.skipped_steps,
                                   "client_state": _checkpoint.encode_client_state(client_state)}}
        if async_save:
            self._finish_async_save()  # the save before: done, and its latest written
            self.strata.save_checkpoint(os.path.join(save_dir, tag), state, async_save=True)
            self._pending_latest = (save_dir, tag) if save_latest else None
            if save_latest:
                _latest_due.add(self)
            return True
        self._finish_async_save()
        self.strata.save_checkpoint(os.path.join(save_dir, tag), state)
        if save_latest:
            _checkpoint.write_latest(save_dir, tag)
        return True

    def wait_checkpoint(self):
        """Collective (Strata's): waits for the asynchronous save in flight, raises its failure, and writes the
        save_dir/latest it names."""
        self._finish_async_save()

    def _finish_async_save(self):
        pending, self._pending_latest = self._pending_latest, None
        _latest_due.discard(self)
        if pending is None:
            return
        self.strata.wait_checkpoint()
        _checkpoint.write_latest(*pending)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """Collective: the checkpoint save_dir/<tag> (default: the tag save_dir/latest names). Returns
        (its directory, client_state), or (None, None) when there is no latest file, as DeepSpeed."""
        partial = {"load_module_strict": (load_module_strict, True),
                   "load_optimizer_states": (load_optimizer_states, True),
                   "load_lr_scheduler_states": (load_lr_scheduler_states, True),
                   "load_module_only": (load_module_only, False), "custom_load_fn": (custom_load_fn, None)}
        for k, (given, default) in partial.items():
            if given is not default and given != default:
                raise NotImplementedError(f"strata.deepspeed.load_checkpoint: {k}={given!r} is not supported; a "
                                          f"checkpoint restores the weights, the optimizer state and the step (so "
                                          f"the lr schedule) together. For the weights alone load a state dict "
                                          f"with engine.module.load_state_dict()")
        self._finish_async_save()
        load_dir = os.fspath(load_dir)
        tag = _checkpoint.resolve_tag(load_dir, tag)
        if tag is None:
            return None, None
        path = os.path.join(load_dir, tag)
        trainer = self.strata.load_checkpoint(path)
        ours = trainer.get(_checkpoint.KEY) if isinstance(trainer, dict) else None
        self.global_steps = self.strata.stats()["steps"]
        if ours is None:  # written by strata.torch or `strata train`: its trainer state is the client state
            self.global_samples, self.skipped_steps, client_state = 0, 0, trainer
        else:
            self.global_steps = int(ours["global_steps"])
            self.global_samples = int(ours["global_samples"])
            self.skipped_steps = int(ours["skipped_steps"])
            client_state = _checkpoint.decode_client_state(ours["client_state"])
        self.micro_steps = self.global_steps * self.gradient_accumulation_steps()
        if self.optimizer is not None:
            self.optimizer.update_lrs()
        return path, client_state

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """Collective: the full weights (model.state_dict() names) in the parameter dtype, torch.save'd by rank 0.
        Always saves (DeepSpeed's ZeRO-3 needs stage3_gather_16bit_weights_on_model_save); returns True."""
        _checkpoint.save_weights(self, save_dir, save_filename, exclude_frozen_parameters)
        return True

    save_fp16_model = save_16bit_model  # DeepSpeed's older name

    def destroy(self):
        self.strata.close()
