"""strata.torch.Engine: a torch model whose parameters, gradients and optimizer state Strata owns."""
import ctypes
import functools
import json
import math
import numbers
import os
import warnings

import torch

from strata import _capi, _comm
from strata._log import who
from strata.torch import _created, _deferred, _export, _fp32_modules, _gathered, _hooks, _model_buffers, _pretrained
from strata.torch import _sharded
from strata.torch._buffers import _TORCH_DTYPE, Layout
from strata.torch._device import choose_device
from strata.torch._units import root_holders, split_units

_lib = _capi.lib


def _config(config):
    if config is None:
        cfg = {}
    elif isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            cfg = json.load(f)
    else:
        cfg = json.loads(json.dumps(config))  # a deep copy, and proof it is plain JSON
    return cfg


def _live_units(model, specs):
    """The default strata.max_live_units: the root unit stays gathered through the whole forward and
    backward, so one more buffer than `strata train` needs lets the next block be prefetched beside it
    (3); a model without a root (Note [Leaf units] in _units) needs what `strata train` does (2). A module
    split into trainable and frozen parts holds two buffers while it runs."""
    roots = sum(s.module is model for s in specs)
    parts = {}
    for s in specs:
        if s.module is not model:
            parts[id(s.module)] = parts.get(id(s.module), 0) + 1
    return max(3 if roots else 2, roots + 2 * max(parts.values(), default=1))


def _hidden_size(model):
    """The model's hidden size for a config's "auto" ZeRO bucket sizes (Hugging Face's rule), 0 if unknown."""
    cfg = getattr(model, "config", None)
    for name in ("hidden_size", "d_model", "n_embd"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _frozen_kept_in_half(model, kept):
    """The parameters kept in fp32 (ids in `kept`, Note [Modules kept in fp32] in _fp32_modules) that are frozen
    (requires_grad=False): a frozen unit keeps no fp32 master, only its param storage, so they stay in the param
    dtype, as before the rule and as DeepSpeed computes them. Said in a warning naming them, never silently:
    peft's LoRA freezes a MoE router (`gate.weight`), and Ernie-4.5-MoE creates its routing bias frozen, so a
    refusal stopped those runs. Returns `kept` without them."""
    frozen = [(n, p) for n, p in model.named_parameters() if id(p) in kept and not p.requires_grad]
    if frozen:
        names = [n for n, _ in frozen]
        shown = ", ".join(f"'{n}'" for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        warnings.warn(f"{who()}: {len(names)} frozen parameter(s) that transformers keeps in fp32 under a half-"
                      f"precision load (the model's _keep_in_fp32_modules_strict / _keep_in_fp32_modules) compute "
                      f"in the param dtype, as DeepSpeed computes them: {shown}. A frozen parameter has no fp32 "
                      f"master here. To silence this: set the config's \"data_types\": "
                      f"{{\"keep_in_fp32_modules\": []}} (every parameter in the param dtype), or make them "
                      f"trainable to keep them in fp32", stacklevel=3)
    return kept - {id(p) for _, p in frozen}


def _refuse_fp32_in_backward_updates(engine, specs):
    """At stage 3 a unit kept in fp32 (Note [Modules kept in fp32] in _fp32_modules) gathers its fp32 master at
    each use, its backward's included, and with strata.optimizer_in_backward the engine refuses that gather once
    the backward has updated other units: refused here, before the first step, naming the ways out (else the
    first backward failed with an error about a GatherUnit the script never called)."""
    kept = [s.name for s in specs if s.fp32]
    if (kept and engine.resolved["zero_optimization.stage"] == "3"
            and engine.resolved["strata.optimizer_in_backward"] == "true"):
        engine.close()
        raise ValueError(f"strata: \"strata\": {{\"optimizer_in_backward\": true}} at ZeRO stage 3 cannot compute "
                         f"the parameters kept in fp32 (units {', '.join(kept[:4])}{' ...' if len(kept) > 4 else ''}"
                         f": transformers' _keep_in_fp32_modules): each use gathers their fp32 master, which the "
                         f"engine refuses once the backward has updated other units. Use stage 2, turn "
                         f"optimizer_in_backward off, or set \"data_types\": {{\"keep_in_fp32_modules\": []}} to "
                         f"compute them in the param dtype (docs/decisions/0045-modules-kept-in-fp32.md)")


def _param_hyper(weight_decay, lr):
    """(qualified name, param) -> (decays, own weight decay or None, own lr or None), from shard()'s callables
    (Note [Param groups] in runtime/optim/optimizer.cc). weight_decay: a float (or numpy float) is the
    parameter's own decay (0.0: none); a bool (or int) says whether it decays by the config's
    optimizer.params.weight_decay; anything else (None, a tensor, a string) is refused, naming the parameter. lr: None
    for the config's lr, or a number, the parameter's own."""
    def number(value, what, name):
        v = float(value)
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"strata: {what} gives parameter '{name}' {value!r}; it must be a finite number >= 0")
        return v

    def hyper(name, p):
        wd = weight_decay(name, p)
        if isinstance(wd, numbers.Integral):  # bool, int, numpy integers: the flag (as before own values)
            decays, own_wd = bool(wd), None
        elif isinstance(wd, numbers.Real):  # float, numpy floats: the parameter's own decay
            own_wd = number(wd, "weight_decay=", name)
            decays, own_wd = own_wd != 0.0, (own_wd if own_wd != 0.0 else None)
        else:  # a tensor, a string, None: never guessed (a truthy value would decay by the config's value)
            raise TypeError(f"strata: weight_decay= gives parameter '{name}' {wd!r} ({type(wd).__name__}); return "
                            f"a float (its own weight decay; 0.0 for none) or a bool (True: the config's "
                            f"optimizer.params.weight_decay)")
        own_lr = None if lr is None else lr(name, p)
        if own_lr is not None:
            if isinstance(own_lr, bool) or not isinstance(own_lr, numbers.Real):
                raise TypeError(f"strata: lr= gives parameter '{name}' {own_lr!r}; return a number (its own lr) or "
                                f"None (the config's optimizer.params.lr)")
            own_lr = number(own_lr, "lr=", name)
        return decays, own_wd, own_lr
    return hyper


class Engine:
    """Made by strata.torch.shard. The model's parameters are the engine's from then on: views of its
    gathered buffers while a unit computes, empty placeholders otherwise."""

    def __init__(self, model, config=None, unit_classes=None, weight_decay=None, lr=None, device=None,
                 process_group=None, device_mesh=None, pretrained=None, pretrained_strict=True,
                 _warn_default_optimizer=True):
        _comm.destroy_dropped()  # those the script dropped without close() (Note [Dropped engines] in strata._comm)
        created = None
        config = _config(config)
        default_optimizer = "optimizer" not in config
        if device_mesh is not None:
            if process_group is not None:
                raise ValueError("strata: give st.shard a process_group or a device_mesh, not both")
            process_group = _comm.mesh_group(device_mesh, config)
        _comm.bind(process_group)  # the ranks first: a factory's creation broadcasts rank 0's generator on them
        if not isinstance(model, torch.nn.Module):  # a factory: the model is created sharded (_created)
            created = _created.Created(model, lazy=pretrained is not None)
            model = created.model
        else:  # built inside a deepspeed.zero.Init() block: created sharded too, from that block's record
            rec = _deferred.adopt(model)
            if rec is not None:
                rec.model = model
                created = _created.Created(None, rec)
        if getattr(model, "_strata_sharded", False):  # its parameters are an engine's placeholders now
            raise RuntimeError("strata: this model was already given to st.shard(); its parameters belong to that "
                               "engine (empty placeholders outside a forward). Keep using that engine, or build a "
                               "new model and load the weights into it (engine.full_state_dict(), or a checkpoint)")
        self.model = model
        self.config = config
        self.broadcast_buffers = _model_buffers.take_option(self.config)  # strata.broadcast_buffers
        self.micro_batches = 0
        self.handle = None
        # Note [Modules kept in fp32] (_fp32_modules): transformers' rule for its fp32 modules, or the
        # config's data_types.keep_in_fp32_modules
        self.param_dtype = _fp32_modules.param_dtype(self.config)
        rule = _fp32_modules.Rule(model, self.param_dtype, _fp32_modules.take_option(self.config))
        kept = _frozen_kept_in_half(model, rule.params(model)) if rule else frozenset()
        specs = split_units(model, unit_classes, kept)
        if not specs:
            raise ValueError("strata: the model has no parameters")
        self.config.setdefault("strata", {}).setdefault("max_live_units", _live_units(model, specs))
        # torch.optim's rule for a parameter without a gradient (Note [Parameters without a gradient]), unless
        # the config asks for DeepSpeed's ("zero")
        self.config["strata"].setdefault("params_without_grad", "skip")
        self.device = self._start_device(model, device)
        cuda = self.device.type == "cuda"
        comm = _comm.strata_comm(cuda, self.config["strata"].get("collective_timeout_ms", 0), process_group)
        if cuda:
            self._torch_on_cuda()
        opts = _capi.EngineOptions.new(config_json=json.dumps(self.config).encode(), device=int(cuda),
                                       hidden_size=_hidden_size(model))
        handle = ctypes.c_void_p()
        status = _lib.strata_engine_create(comm, opts, ctypes.byref(handle))
        if status != 0 and not cuda and _comm.dev_shm_full(status):  # Note [The host transport under torchrun]
            comm = _comm.host_comm_on_gloo(self.config["strata"].get("collective_timeout_ms", 0), process_group)
            status = _lib.strata_engine_create(comm, opts, ctypes.byref(handle))
        _capi.check(status)
        self.handle = handle
        self._finalizer = _comm.track(self, cuda)
        self.resolved = self._resolved_config()  # the engine's reading of the config: batch sizes, defaults
        if default_optimizer and _warn_default_optimizer:
            r = self.resolved
            warnings.warn(f"{who()}: the config has no \"optimizer\", so the engine trains with Strata's default: "
                          f"{r['optimizer.type']}, lr {r['optimizer.params.lr']}, weight_decay "
                          f"{r['optimizer.params.weight_decay']} (DeepSpeed would step the optimizer the script "
                          f"passes it, Hugging Face's Trainer its own); name the optimizer and its lr in the config",
                          stacklevel=3)
        if self.resolved["strata.param_dtype"] != {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
                self.param_dtype, "fp32"):
            raise RuntimeError(f"strata: the engine computes in {self.resolved['strata.param_dtype']} but the front "
                               f"end read {self.param_dtype} from the config; modules kept in fp32 (Note [Modules "
                               f"kept in fp32]) would not be: report this")
        _refuse_fp32_in_backward_updates(self, specs)
        self.accumulation = int(self.resolved["gradient_accumulation_steps"])
        self.fp16 = self.resolved["fp16.enabled"] == "true"  # then engine.backward(loss) scales the loss
        if weight_decay is None:  # strata.weight_decay_1d: DeepSpeed's rule (every parameter) unless false
            decay_1d = self.resolved["strata.weight_decay_1d"] == "true"
            weight_decay = lambda name, p: decay_1d or p.ndim >= 2  # noqa: E731
        self._own_lr = {}  # id(param): its own lr (Note [Param groups]), for lr(param)
        self.units = [self._register(i, s, _param_hyper(weight_decay, lr)) for i, s in enumerate(specs)]
        object.__setattr__(model, "_strata_sharded", True)  # not a module attribute: no state_dict entry
        _capi.check(_lib.strata_engine_finalize(self.handle))
        if created is not None:
            # the recorded construction replayed into the engine, one tensor at a time; of a model loaded from
            # `pretrained`, only what the checkpoint does not supply (docs/decisions/0034, "Pretrained at creation")
            created.load(self, frozenset() if pretrained is None else
                         self._closed_on_error(_pretrained.supplied, self, pretrained, pretrained_strict))
            for u in self.units:
                u.clear()
        else:
            self._load_initial_values()
        if cuda:
            self._buffers_to_device()
        self.model_buffers = _model_buffers.ModelBuffers(model, _TORCH_DTYPE[self.units[0].layout.dtype][0],
                                                         self.broadcast_buffers,  # rank 0's, cast as params
                                                         rule.buffers(model) if rule else frozenset())
        self.roots = [u for u in self.units if u.spec.module is model]  # the root's trainable and frozen parts
        self.tracker = _hooks.Tracker(self, self.units)
        self.refresh_fp32()
        self._install_hooks()
        _gathered.install(self)  # model.state_dict() / load_state_dict(), GatheredParameters, .grad markers
        _sharded.guard_apply(self)  # model.to(dtype or device) refused (Note [Parameters between uses])
        # st.shard(..., pretrained=DIR): load_pretrained's {"missing_keys", "unexpected_keys"}, else None
        self.pretrained_keys = None if pretrained is None else \
            self._closed_on_error(self.load_pretrained, pretrained, pretrained_strict)

    def _closed_on_error(self, fn, *args):
        """fn(*args) of st.shard(..., pretrained=): a checkpoint the ranks refuse together closes the engine (the
        caller never gets it) before the error is raised."""
        try:
            return fn(*args)
        except (_pretrained.CheckpointError, OSError):
            self.close()
            raise

    # ---- set-up ----
    def refresh_fp32(self):
        """Collective. At stages 0-2 (parameters replicated) the full fp32 master of each unit kept in fp32 (Note
        [Modules kept in fp32] in _fp32_modules) is held on every rank, so a forward needs no collective for it
        (an evaluation forward is local there); this reads it again, after anything that changed the master."""
        self.fp32_copies = {}
        if int(self.resolved["zero_optimization.stage"]) < 3:
            for u in self.units:
                if u.spec.fp32:
                    self.fp32_copies[u.id] = self.gather_unit(u.id).to(self.device)

    def fp32_values(self, u):
        """The full fp32 master of unit `u` (one kept in fp32) for one use: the replicated copy at stages 0-2,
        else gathered now (collective, as the unit's own gather is)."""
        copy = self.fp32_copies.get(u.id)
        return copy if copy is not None else self.gather_unit(u.id).to(self.device)

    def wrote_param(self, unit, index, value):
        """After strata_engine_set_param(unit, index, value) (every rank the same full value): the replicated
        fp32 copy follows, without a collective."""
        copy = getattr(self, "fp32_copies", {}).get(unit)
        if copy is not None:
            o, n = self.units[unit].layout.offsets[index], self.units[unit].layout.numels[index]
            copy[o:o + n].copy_(value.reshape(-1))

    def _resolved_config(self):
        out = ctypes.c_char_p()
        _capi.check(_lib.strata_engine_config_json(self.handle, ctypes.byref(out)))
        return json.loads(out.value.decode())

    def _start_device(self, model, requested):
        """The engine's device (_device.choose_device); on CUDA it becomes torch's current device, the
        one strata_comm_create_torchrun and the engine take (unverified on a GPU)."""
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        d = choose_device([p.device for p in model.parameters()], requested, os.environ, cuda_count,
                          torchrun=_comm._torchrun() is not None)
        if d.type == "cuda" and cuda_count > 0:
            torch.cuda.set_device(d)
        return d

    def _torch_on_cuda(self):
        """After the communicator (whose bootstrap names a GPU strata cannot see): torch must see it too;
        the model's buffers (not parameters: those become the engine's) move to it (_buffers_to_device)."""
        if not torch.cuda.is_available():
            raise RuntimeError(f"strata: rank {_comm.rank()}: the engine is on {self.device}, but torch sees no "
                               f"CUDA GPU (torch {torch.__version__}, CUDA {torch.version.cuda}; "
                               f"torch.cuda.is_available() is False)")

    def _buffers_to_device(self):
        """Once the model's buffers hold their values (a created model's are made with the initial values)."""
        for m in self.model.modules():
            for k, b in m._buffers.items():
                if b is not None and b.device != self.device:
                    m._buffers[k] = b.to(self.device)

    def fence(self):
        """Before end_forward / end_backward: torch's queued kernels that read the unit's parameters or
        write its gradients finish first (the C ABI's contract for a CUDA engine), so the engine's streams
        may then reuse the gathered buffer and reduce the gradients. A host engine computes synchronously."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _register(self, uid, spec, hyper):
        keep = []  # the specs' strings and shapes live until the call returns
        arr = (_capi.ParamSpec * len(spec.params))()
        for i, (n, p) in enumerate(zip(spec.names, spec.params)):
            qual = n if spec.module is self.model else f"{spec.prefix}.{n}"  # the model.named_parameters() name
            if p.dtype != torch.float32:
                raise _created.not_fp32(qual, p.dtype)
            shape = (ctypes.c_int64 * max(p.ndim, 1))(*(p.shape if p.ndim else (1,)))
            keep.append(shape)
            decays, own_wd, own_lr = hyper(qual, p)
            arr[i] = _capi.ParamSpec.new(name=n.encode(), shape=shape, ndim=max(p.ndim, 1), weight_decay=int(decays),
                                         frozen=int(spec.frozen), has_own_lr=int(own_lr is not None),
                                         own_lr=own_lr or 0.0, has_own_weight_decay=int(own_wd is not None),
                                         own_weight_decay=own_wd or 0.0)
            self._own_lr[id(p)] = own_lr
        out = ctypes.c_int32()
        _capi.check(_lib.strata_engine_register_unit(self.handle, spec.name.encode(), arr, len(spec.params),
                                                     ctypes.byref(out)))
        assert out.value == uid
        shapes, offsets, numels, dtype = [], [], [], None
        for i, p in enumerate(spec.params):
            info = _capi.ParamInfo.new()
            _capi.check(_lib.strata_engine_param_info(self.handle, uid, i, info))
            shapes.append(tuple(p.shape))
            offsets.append(info.offset_elems)
            numels.append(info.numel)
            dtype = info.dtype
        return _hooks.UnitState(uid, spec, Layout(shapes, offsets, numels, dtype,
                                                  self.device if self.device.type == "cuda" else None))

    def _load_initial_values(self):
        """Rank 0's values of the torch model become every rank's (so ranks need not seed alike): one broadcast
        per unit, of its parameters end to end (Note [A collective per unit])."""
        for u in self.units:
            if not u.spec.params:
                u.clear()
                continue
            flat = torch.cat([p.detach().to("cpu", torch.float32).reshape(-1) for p in u.spec.params])
            _comm.broadcast_from_0(flat)
            first = 0
            for i, p in enumerate(u.spec.params):
                v = flat[first:first + p.numel()]
                first += p.numel()
                _capi.check(_lib.strata_engine_set_param(self.handle, u.id, i, ctypes.c_void_p(v.data_ptr()),
                                                         v.numel()))
            u.clear()

    def _install_hooks(self):
        t = self.tracker
        inner = self.model.forward

        @functools.wraps(inner)
        def forward(*args, **kwargs):  # an instance attribute: nn.Module.__call__ finds it first
            t.root_enter()
            try:
                if t.phase == _hooks.FORWARD:  # a training forward: rank 0's buffers (strata.broadcast_buffers)
                    self.model_buffers.before_training_forward()
                output = inner(*args, **kwargs)
            except BaseException as e:
                t.root_abandon(e)
                raise
            return t.root_exit(output)

        self.model.forward = forward
        for u in self.units:  # a module with trainable and frozen parts: both hooks, in that order
            if u in self.roots:
                continue
            u.spec.module.register_forward_pre_hook(lambda m, a, k, u=u: t.block_pre(u, a, k), with_kwargs=True)
            u.spec.module.register_forward_hook(lambda m, a, o, u=u: t.block_post(u, o))
        # Note [The root outside the forward] (_hooks): a module reading the root's parameters, called directly
        for name, m in root_holders(self.model, [p for r in self.roots for p in r.spec.params]):
            m.register_forward_pre_hook(lambda m, a: t.holder_pre(m))
            m.register_forward_hook(lambda m, a, o, name=name: t.holder_post(m, name, o), always_call=True)

    # ---- training ----
    def loss_scale(self):
        """The factor the loss is multiplied by before backward: the fp16 loss scale (1 without fp16)."""
        out = ctypes.c_float()
        _capi.check(_lib.strata_engine_loss_scale(self.handle, ctypes.byref(out)))
        return out.value

    def backward(self, loss, retain_graph=False):
        """loss.backward() with the loss multiplied by the loss scale first, as DeepSpeed's engine.backward: with
        fp16 the engine divides the gradients by it again, skips a step whose gradients overflowed and adjusts
        the scale (fp16.hysteresis, loss_scale_window, ...). Without fp16 it is loss.backward()."""
        scale = self.loss_scale()
        self.tracker.scaled_backward = True
        try:
            (loss * scale if scale != 1 else loss).backward(retain_graph=retain_graph)
        finally:
            self.tracker.scaled_backward = False

    def step(self):
        """The optimizer step (collective), after gradient_accumulation_steps forward+backward passes.
        Returns the engine's step result: step, skipped, clip_coef, grad_norm, lr, loss_scale."""
        self.refuse_closed("step()")
        _gathered.refuse_while_gathered(self, "step()")
        if self.tracker.phase != _hooks.IDLE or self.micro_batches != self.accumulation:
            raise RuntimeError(f"strata: step() after {self.micro_batches} completed backward passes (phase "
                               f"'{self.tracker.phase}'); gradient_accumulation_steps={self.accumulation} "
                               f"forward+backward passes must come first")
        _gathered.check_markers(self)
        r = _capi.StepResult.new()
        _capi.check(_lib.strata_engine_step(self.handle, r))
        self.micro_batches = 0
        self.refresh_fp32()  # the master changed (Note [Modules kept in fp32] in _fp32_modules)
        _gathered.drop_grad_markers(self)  # the gradients are zero now: .grad None (Note [Gradients in the engine])
        self.model_buffers.after_step()
        return {k: getattr(r, k) for k in ("step", "skipped", "clip_coef", "grad_norm", "lr", "loss_scale")}

    def lr(self, param=None):
        """The learning rate the next step() will use: the config's scheduler at the current step (what that
        step's result will report as 'lr'), for the parameters without an lr of their own; lr(param) for one
        parameter of the model (its own lr, shard(lr=...), under the config's scheduler)."""
        if param is None:
            return self.group_lr(None)
        if id(param) not in self._own_lr:
            raise ValueError("strata: lr(param): the tensor is not a parameter of this engine's model")
        return self.group_lr(self._own_lr[id(param)])

    def group_lr(self, own_lr):
        """The learning rate the next step() gives the parameters whose own lr is `own_lr` (None: the config's
        lr), under the config's scheduler: DeepSpeed's rule for a param group's lr (docs/decisions/0032)."""
        out = ctypes.c_double()
        _capi.check(_lib.strata_engine_group_lr(self.handle, int(own_lr is not None),
                                                float(own_lr) if own_lr is not None else 0.0, ctypes.byref(out)))
        return out.value

    def zero_grad(self):
        """A no-op where allowed: the engine zeroes gradients at each step; refuses once a pass began."""
        _capi.check(_lib.strata_engine_zero_grad(self.handle))

    # ---- state ----
    def save_checkpoint(self, root_dir, client_state=None, async_save=False):
        """Collective: <root_dir>/step_<8 digits>, the layout `strata train` writes and `strata ckpt` reads,
        with the model's buffers (rank 0's) in it. async_save=True writes the same files in the background
        (docs/decisions/0036-async-checkpoints.md): it returns once the state is copied to host memory, or, for
        state on NVMe, held without a copy (docs/decisions/0046-async-checkpoints-of-nvme-state.md), as frozen
        parameters at stage 3 are (0050-frozen-units-held-in-place.md: setting one waits for the save); a failure
        is raised by the next step() (which then did not happen: call it again), save_checkpoint() or
        wait_checkpoint(). One save in flight: a save or load waits for the one before. Where NVMe state is
        cloned into the checkpoint (XFS, btrfs: decisions 0057, 0058), the save is published once the next step has
        read the cloned tiles, at once on wait_checkpoint(), and at most 2 minutes later otherwise."""
        trainer = json.dumps(client_state or {}).encode()
        if self.mid_step() is None:  # else the engine refuses the save
            step_dir = os.path.join(os.fspath(root_dir), f"step_{self.stats()['steps']:08d}")
            self.model_buffers.save(step_dir)  # before the engine publishes the manifest
        save = _lib.strata_engine_save_checkpoint_async if async_save else _lib.strata_engine_save_checkpoint
        _capi.check(save(self.handle, os.fspath(root_dir).encode(), trainer))

    def wait_checkpoint(self):
        """Collective: waits for the asynchronous save in flight; raises the last one's failure."""
        _capi.check(_lib.strata_engine_wait_checkpoint(self.handle))

    def checkpoint_in_flight(self):
        """Whether an asynchronous save is being written on this rank (not collective). A save of cloned NVMe
        state stays in flight until the next step read its tiles, at most 2 minutes (decision 0058)."""
        out = ctypes.c_int32()
        _capi.check(_lib.strata_engine_checkpoint_in_flight(self.handle, ctypes.byref(out)))
        return bool(out.value)

    def load_checkpoint(self, path):
        """Collective: a step directory or a root (its latest step), of any world size and stage. Returns the
        client_state saved with it. The model's buffers come from it too (on every rank, rank 0's read)."""
        _gathered.refuse_while_gathered(self, "load_checkpoint()")
        out = ctypes.c_char_p()
        step_dir, buffers = self.model_buffers.read_checkpoint(path)  # validated before anything changes
        _capi.check(_lib.strata_engine_load_checkpoint(self.handle, step_dir.encode(), ctypes.byref(out)))
        self.refresh_fp32()
        self.model_buffers.install(buffers)
        return json.loads(out.value.decode()) if out.value else {}

    def gather(self, unit, index):
        u = self.units[unit]
        v = torch.empty(u.layout.shapes[index], dtype=torch.float32)
        _capi.check(_lib.strata_engine_gather_param(self.handle, unit, index, ctypes.c_void_p(v.data_ptr()),
                                                    v.numel()))
        return v

    # Note [A collective per unit]. The front end's whole-value transfers go one collective per unit, not per
    # parameter: st.shard broadcasts rank 0's initial values a unit at a time (its parameters end to end), and
    # full_state_dict and st.GatheredParameters take a unit's parameters from one gather_unit. A parameter's own
    # gather (strata_engine_gather_param) gathers its whole unit anyway, so per parameter a unit of k parameters
    # cost k collectives of the unit's size where one does; the values are the same bits (a broadcast and a
    # gather copy). What it saves is per-collective latency, which is what a small model's collectives are: about
    # 2-4 ms each over torch's gloo at 4 ranks on this machine's 2 cores, 0.1 ms over MPI (docs/decisions/
    # 0049-fewer-front-end-collectives.md). Memory: one unit's full values at a time beside what the caller keeps.
    def gather_params(self, pairs):
        """Collective: {(unit, index): the full fp32 master value} of the parameters `pairs` names (every rank the
        same pairs, in the same order), one gather per unit (Note [A collective per unit])."""
        by_unit = {}
        for unit, index in pairs:
            indices = by_unit.setdefault(unit, [])
            if index not in indices:
                indices.append(index)
        out = {}
        for unit, indices in by_unit.items():
            flat, layout = self.gather_unit(unit), self.units[unit].layout
            for i in indices:
                o, n = layout.offsets[i], layout.numels[i]
                out[(unit, i)] = flat[o:o + n].view(layout.shapes[i]).clone()  # its own storage, as gather()'s
        return out

    def gather_unit(self, unit):
        """Collective: the full fp32 master of one unit's parameters, one gather: a flat tensor in which parameter
        i is [offsets[i], offsets[i] + numels[i]) of the unit's Layout."""
        u = self.units[unit]
        v = torch.empty(u.layout.total, dtype=torch.float32)
        _capi.check(_lib.strata_engine_gather_unit(self.handle, unit, ctypes.c_void_p(v.data_ptr()), v.numel()))
        return v

    def full_state_dict(self):
        """Collective: model.state_dict()'s names, with each parameter's full fp32 master value (tied names
        share one tensor) and the model's buffers, rank 0's on every rank."""
        where = {id(p): (u.id, i) for u in self.units for i, p in enumerate(u.spec.params)}
        buffers = self.model_buffers.rank0_values()
        state = self.model.state_dict(keep_vars=True)
        values, out = self.gather_params(where[id(t)] for t in state.values() if id(t) in where), {}
        for name, t in state.items():
            if id(t) in where:
                out[name] = values[where[id(t)]]
            elif id(t) in buffers:
                out[name] = buffers[id(t)]
            else:
                out[name] = t.detach().clone()
        return out

    def save_pretrained(self, save_directory, max_shard_size="50GB", trainable_only=False, dtype=None):
        """Collective, between steps: the model in Hugging Face's layout in `save_directory`, written one unit
        at a time (no rank holds more than one unit's full tensors): safetensors files of at most
        `max_shard_size` (bytes, or "5GB" / "512MiB") with model.safetensors.index.json, or one
        model.safetensors, plus config.json for a transformers model; tied and renamed as transformers'
        save_pretrained writes them, so from_pretrained loads it. The fp32 master values, cast to `dtype`
        (torch.bfloat16 or float16) if given. trainable_only=True: the trainable parameters alone, the frozen
        units never gathered (a peft model: its adapter, in peft's layout). Returns the weight files' names.
        Note [Streaming export] in _export."""
        return _export.save_pretrained(self, save_directory, max_shard_size, trainable_only, dtype)

    def load_pretrained(self, directory, strict=True):
        """Collective, between steps: a Hugging Face checkpoint directory (model.safetensors, or
        model.safetensors.index.json and its files; F32, BF16 or F16 parameters) into the engine, each rank
        reading only the byte ranges of the elements its shards keep. Every file is validated as untrusted input
        (errors name the file and the tensor). strict=False loads what matches and returns {"missing_keys",
        "unexpected_keys"}. The optimizer state is left as it is (as load_state_dict leaves a torch optimizer).
        Typically right after st.shard(factory, config). Note [Pretrained into shards] in _pretrained."""
        out = _pretrained.load_pretrained(self, directory, strict)
        self.refresh_fp32()
        return out

    def stats(self):
        s = _capi.Stats.new()
        _capi.check(_lib.strata_engine_get_stats(self.handle, s))
        return {n: getattr(s, n) for n, _ in _capi.Stats._fields_[2:]}

    def mid_step(self):
        """Why this engine is in the middle of a step (a training pass begun, or passes done and no step()
        since), or None: then its peers may be waiting for it in a collective."""
        if self.handle is None or getattr(self, "tracker", None) is None:  # closed, or never finished building
            return None
        if self.tracker.phase in (_hooks.FORWARD, _hooks.AWAIT_BACKWARD, _hooks.BACKWARD):
            return f"a training pass was in phase '{self.tracker.phase}'"
        if self.micro_batches > 0:
            return f"{self.micro_batches} backward passes were done and step() was not called"
        return None

    def refuse_closed(self, what):
        if self.handle is None:
            raise RuntimeError(f"strata: {what} after engine.close(): the engine and its shards of the model are "
                               f"gone; build a new engine with st.shard (its weights from a checkpoint or "
                               f"save_pretrained written before the close)")

    def close(self):
        """Collective. Runs the front ends' before-close callbacks first (strata.deepspeed writes the `latest` of
        its asynchronous save there), then destroys the engine (which waits for a save in flight)."""
        if self.handle is not None:
            for fn in getattr(self, "before_close", []):
                fn()
            self._finalizer.detach()
            _lib.strata_engine_destroy(self.handle)
            self.handle = None
