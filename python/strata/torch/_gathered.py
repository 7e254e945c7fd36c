"""Full parameters outside a training pass: model.state_dict() and load_state_dict() of a sharded model,
st.GatheredParameters, and what .grad holds between a backward and engine.step().

Between uses a sharded parameter is an empty placeholder (_buffers.placeholder), so torch's own state_dict
would hand out (0,)-shaped tensors and load_state_dict would fail on the shape. Instead:

- model.state_dict() (and a submodule's, transformers' save_pretrained, peft's): a state-dict post-hook on
  each module that owns a parameter of an engine replaces the placeholder's entry by the parameter's full
  fp32 master value, gathered through the engine (Engine.gather, collective: every rank calls state_dict,
  in the same order). Tied names share one gathered tensor within one traversal of the model. With
  keep_vars=True the entries stay the Parameter objects themselves (what that flag asks for; their values
  are placeholders between uses), which is how full_state_dict finds each parameter.
- model.load_state_dict(sd): a pre-hook on each such module takes the module's parameter entries out of
  the dictionary torch loads from, checks rank 0's (names and shapes, as torch would), broadcasts rank 0's
  values and writes them into the engine (strata_engine_set_param: the fp32 master the optimizer updates
  and the rank's parameter storage; the Adam moments stay, as torch's load_state_dict leaves an optimizer
  alone). A post-hook takes those keys back out of missing_keys. Collective: rank 0's values are loaded
  on every rank (as shard() takes rank 0's initial values).
- GatheredParameters (DeepSpeed's zero.GatheredParameters): the listed parameters hold their full values
  inside the context; with modifier_rank=r the parameters rank r changed are broadcast from r and set in
  the engine at exit; with modifier_rank=None a change on any rank is an error at exit (it would be lost).
- .grad: Note [Gradients in the engine].
All of these are refused (an error, the same on every rank) inside the model's forward or backward.
"""
import ctypes
import hashlib
import math
import weakref

import torch

from strata import _capi, _comm
from strata.torch._sharded import applying, set_placeholder, set_values

# Note [Gradients in the engine]. A parameter's .grad is a view of the engine's gradient buffer only
# while its unit's backward is open; after it the gradient is reduced across ranks (sharded from stage 2)
# and exists as a whole on no rank, so p.grad would be None and a hand-called
# torch.nn.utils.clip_grad_norm_(model.parameters(), c) would compute 0 over no gradients and clip
# nothing, silently. So at the end of each backward every trainable parameter's .grad becomes a marker:
# an empty tensor whose every op raises GRAD_MESSAGE (metadata reads such as .shape or .dtype excepted),
# so clip_grad_norm_, a torch optimizer or a hand-written norm over p.grad fail naming the config key.
# `p.grad is None` is then False, as in torch after a backward. The markers are dropped when the next
# training forward begins (before any autograd accumulation: the engine's views replace them as each
# unit's backward begins) and after engine.step() (which zeroes the engine's gradients; None is torch's
# zeroed .grad); an evaluation forward (torch.no_grad()) between a backward and the step keeps them (its
# units' uses end in UnitState.clear, which leaves a marker). Frozen parameters keep None. Clearing a
# marker (model.zero_grad(), p.grad = None) would be torch's "no gradient this step", which the engine
# cannot honour: it is refused (Note [Parameters between uses] in _sharded), and engine.step() refuses a
# marker cleared past that (check_markers).
GRAD_MESSAGE = ("strata: the gradients of a sharded model live in the engine, reduced across ranks, until "
                "engine.step(); .grad cannot be read or changed between a backward and the step. For gradient "
                "clipping set the config key `gradient_clipping` (the engine clips by the global norm in "
                "step(); engine.step() returns it as 'grad_norm') instead of calling "
                "torch.nn.utils.clip_grad_norm_; for the optimizer, use engine.step()")

_METADATA = frozenset(("shape", "dtype", "device", "layout", "requires_grad", "grad_fn", "is_leaf", "ndim",
                       "is_sparse", "is_cuda", "is_cpu", "is_meta", "is_quantized", "is_nested", "is_mkldnn"))


class GradInEngine(torch.Tensor):
    """The .grad of a trainable parameter between a backward and engine.step() (Note [Gradients in the
    engine]): empty, and every op on it raises GRAD_MESSAGE."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if applying() or (getattr(func, "__name__", "") == "__get__" and  # applying: a model.to() changing nothing
                          getattr(getattr(func, "__self__", None), "__name__", None) in _METADATA):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        raise RuntimeError(GRAD_MESSAGE)


# ---- which engine owns a parameter ----
_owners = {}                 # id(param) -> (weakref(param), weakref(engine), unit, index, qualified name)
_engines = weakref.WeakKeyDictionary()   # engine -> _State
_hooked = weakref.WeakSet()  # modules with the state-dict hooks (once per module, whichever engine)
_roots = weakref.WeakSet()   # sharded models with the traversal hooks
_tie = None                  # within one traversal of a sharded model: the tensors gathered so far


class _State:
    def __init__(self):
        self.gathered = {}   # id(param) -> contexts holding it gathered (the outermost one restores it)
        self.marked = []     # trainable parameters (they get markers)


class _Owner:
    def __init__(self, param, engine, unit, index, name):
        self.param, self.engine, self.unit, self.index, self.name = param, engine, unit, index, name

    @property
    def shape(self):
        return tuple(self.engine.units[self.unit].layout.shapes[self.index])


def owner(p):
    """The _Owner of an engine's parameter, or None for a tensor no engine holds. Raises when its engine was
    closed (the values are gone: a placeholder is all that is left)."""
    entry = _owners.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    ref, engine_ref, unit, index, name = entry
    engine = engine_ref()
    if engine is None or engine.handle is None:
        raise RuntimeError(f"strata: parameter '{name}' belonged to an engine that was closed; its values are "
                           f"gone (take engine.full_state_dict() before engine.close())")
    return _Owner(p, engine, unit, index, name)


def _is_placeholder(o):
    return o.param.numel() == 0 and math.prod(o.shape) > 0


def _refuse_in_pass(engine, what):
    from strata.torch import _hooks  # noqa: PLC0415  (_hooks imports this module)
    if engine.tracker.phase != _hooks.IDLE:
        raise RuntimeError(f"strata: {what} during the model's forward or backward (phase "
                           f"'{engine.tracker.phase}'); call it before the forward or after the backward")


def holds_gathered(engine):
    """The number of the engine's parameters a GatheredParameters context holds (the same on every rank)."""
    s = _engines.get(engine)
    return 0 if s is None else len(s.gathered)


def refuse_while_gathered(engine, what):
    """Engine.step and load_checkpoint inside a GatheredParameters context would change the values the
    context's exit writes back (or discards): refused."""
    n = holds_gathered(engine)
    if n:
        raise RuntimeError(f"strata: {what} inside st.GatheredParameters ({n} parameters gathered); "
                           f"leave the context first")


def _set(o, value):
    """Writes a full value (every rank the same) into the engine: its fp32 master and parameter storage."""
    v = value.detach().to("cpu", torch.float32).contiguous()
    _capi.check(_capi.lib.strata_engine_set_param(o.engine.handle, o.unit, o.index, ctypes.c_void_p(v.data_ptr()),
                                                  v.numel()))
    o.engine.wrote_param(o.unit, o.index, v)  # Note [Modules kept in fp32] in _fp32_modules


# ---- model.state_dict() ----
def _begin_traversal(module, prefix, keep_vars):
    global _tie
    _tie = {"root": module, "dest": None, "values": {}}


def _end_traversal(module, destination, prefix, local_metadata):
    global _tie
    if _tie is not None and _tie["root"] is module:
        _tie = None


def _full_value(o, destination):
    """o's gathered value; a tied parameter met again in the same traversal (the same destination) gets
    the tensor gathered the first time."""
    global _tie
    tie = _tie
    if tie is not None:
        if tie["dest"] is None:
            tie["dest"] = destination
        elif tie["dest"] is not destination:  # another state_dict call: nothing of the last one holds
            tie.update(dest=destination, values={})
        v = tie["values"].get(id(o.param))
        if v is not None:
            return v
    try:
        v = o.engine.gather(o.unit, o.index)
    except BaseException:
        _tie = None
        raise
    if tie is not None:
        tie["values"][id(o.param)] = v
    return v


def _state_dict_hook(module, destination, prefix, local_metadata):
    for name, p in module._parameters.items():
        v = destination.get(prefix + name) if p is not None else None
        if not isinstance(v, torch.Tensor) or v is p:  # keep_vars=True: the Parameter itself
            continue
        o = owner(p)
        if o is None:
            continue
        _refuse_in_pass(o.engine, "model.state_dict()")
        if _is_placeholder(o):  # else gathered by st.GatheredParameters: its current value, as torch's
            destination[prefix + name] = _full_value(o, destination)


# ---- model.load_state_dict() ----
_loaded = {}  # id(module) -> keys its pre-hook loaded (for its post-hook to take out of missing_keys)


def _load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    mine = []
    for name, p in module._parameters.items():
        o = owner(p) if p is not None else None
        if o is not None and _is_placeholder(o):
            mine.append((prefix + name, o))
    _loaded.pop(id(module), None)
    if not mine:
        return
    _refuse_in_pass(mine[0][1].engine, "model.load_state_dict()")
    plan = None
    if _comm.rank() == 0:  # rank 0's dictionary decides, with torch's messages
        plan = []
        for key, o in mine:
            v = state_dict.get(key)
            if key not in state_dict:
                plan.append(None)
            elif not isinstance(v, torch.Tensor):
                plan.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                            f'object from checkpoint but received {type(v)}')
            elif tuple(v.shape) != o.shape:
                plan.append(f"size mismatch for {key}: copying a param with shape {v.shape} from checkpoint, "
                            f"the shape in current model is {torch.Size(o.shape)}.")
            else:
                plan.append("load")
    plan = _comm.broadcast_object(plan, 0)
    handled = []
    for (key, o), what in zip(mine, plan):
        value = state_dict.pop(key, None)  # torch must not copy into the placeholder
        if what is None:  # not in rank 0's dictionary: torch lists it as missing, on every rank
            continue
        handled.append(key)
        if what != "load":
            error_msgs.append(what)
            continue
        full = value.detach().to("cpu", torch.float32).contiguous().clone() if _comm.rank() == 0 else \
            torch.empty(o.shape, dtype=torch.float32)
        _comm.broadcast(full, 0)
        _set(o, full)
    _loaded[id(module)] = handled


def _load_post_hook(module, incompatible_keys):
    for key in _loaded.pop(id(module), ()):
        while key in incompatible_keys.missing_keys:
            incompatible_keys.missing_keys.remove(key)


# ---- install ----
def _post_hook(module, hook):
    """A state-dict post-hook that modifies the dictionary in place (the private name on a torch too old for
    the public one)."""
    register = getattr(module, "register_state_dict_post_hook", None) or module._register_state_dict_hook
    register(hook)


def install(engine):
    """Called by Engine.__init__ once the parameters are registered: records which parameters are this
    engine's and hooks the modules that own them (once per module) and the model."""
    for k in [k for k, entry in _owners.items() if entry[0]() is None]:  # parameters that are gone
        del _owners[k]
    _engines[engine] = state = _State()
    mine = set()
    for u in engine.units:
        for i, (n, p) in enumerate(zip(u.spec.names, u.spec.params)):
            qual = n if u.spec.module is engine.model else f"{u.spec.prefix}.{n}"
            _owners[id(p)] = (weakref.ref(p), weakref.ref(engine), u.id, i, qual)
            mine.add(id(p))
            if not u.spec.frozen:
                state.marked.append(p)
    for m in engine.model.modules():
        if m not in _hooked and any(p is not None and id(p) in mine for p in m._parameters.values()):
            _post_hook(m, _state_dict_hook)
            m._register_load_state_dict_pre_hook(_load_pre_hook, with_module=True)  # older torch: no public name
            m.register_load_state_dict_post_hook(_load_post_hook)
            _hooked.add(m)
    if engine.model not in _roots:  # after the model's own post-hook above: the traversal ends last
        engine.model.register_state_dict_pre_hook(_begin_traversal)
        _post_hook(engine.model, _end_traversal)
        _roots.add(engine.model)

    def no_forward_while_gathered(module, args):
        if state.gathered and engine.handle is not None:
            raise RuntimeError(f"strata: the model's forward inside st.GatheredParameters ({len(state.gathered)} "
                               f"parameters gathered); leave the context first")
    modules = {id(engine.model): engine.model}
    modules.update((id(u.spec.module), u.spec.module) for u in engine.units)
    for m in modules.values():
        m.register_forward_pre_hook(no_forward_while_gathered, prepend=True)


# ---- .grad between a backward and the step (Note [Gradients in the engine]) ----
def _marked(engine):
    """The trainable parameters whose .grad carries a marker between a backward and the step."""
    s = _engines.get(engine)
    return () if s is None else s.marked


def mark_grads(engine):
    """At the end of a backward: each trainable parameter's .grad becomes a GradInEngine marker."""
    with torch._C.DisableTorchFunction():
        for p in _marked(engine):
            if p.grad is None and p.numel() == 0:
                p.grad = torch.empty(0, dtype=p.dtype, device=p.device).as_subclass(GradInEngine)


def check_markers(engine):
    """engine.step(): every trainable parameter still holds its marker. One cleared past the refusal of
    Note [Parameters between uses] (p.grad = None on a parameter gathered by st.GatheredParameters) would be
    torch's "no gradient this step", which the engine cannot honour: refused, the markers set again."""
    with torch._C.DisableTorchFunction():
        cleared = [p for p in _marked(engine) if p.grad is None]
    if cleared:
        mark_grads(engine)  # the gradients are still the engine's
        name = _owners[id(cleared[0])][4]
        raise RuntimeError(f"strata: the .grad of '{name}' was cleared (model.zero_grad() or p.grad = None, "
                           f"{len(cleared)} parameters) between a backward and engine.step(); the engine holds this "
                           f"step's gradients, reduced across ranks, and cannot drop them: engine.step() applies them. "
                           f"Call zero_grad() before the forward or after engine.step() (the engine zeroes the "
                           f"gradients there)")


def drop_grad_markers(engine):
    """When a training forward begins and after a step: the markers go (None again)."""
    with torch._C.DisableTorchFunction():
        for p in _marked(engine):
            if type(p.grad) is GradInEngine:
                p.grad = None


# ---- GatheredParameters ----
def _digest(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return (tuple(t.shape), t.dtype, hashlib.blake2b(t.contiguous().reshape(-1).view(torch.uint8).numpy()).digest())


def _collect(params):
    """The engine parameters among `params` (a Parameter, an iterable of them, a module, an Engine), each
    once, in the order given; the others are ignored (as DeepSpeed ignores parameters it does not shard)."""
    from strata.torch._engine import Engine  # noqa: PLC0415  (_engine imports this module)
    if isinstance(params, Engine):
        params = params.model.parameters()
    elif isinstance(params, torch.nn.Module):
        params = params.parameters()
    elif isinstance(params, torch.Tensor):
        params = [params]
    out, seen = [], set()
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        o = owner(p)
        if o is not None:
            out.append(o)
    engines = {id(o.engine): o.engine for o in out}
    if len(engines) > 1:
        raise ValueError("strata: st.GatheredParameters was given parameters of several engines; gather each "
                         "engine's separately")
    return out


class GatheredParameters:
    """Collective context manager (DeepSpeed's deepspeed.zero.GatheredParameters):

        with st.GatheredParameters(model.lm_head.weight, modifier_rank=0), torch.no_grad():
            if st.rank() == 0:
                model.lm_head.weight[0].zero_()

    Inside, the listed parameters (a Parameter, an iterable of them, a module for all of its parameters, or
    the Engine for all) hold their full fp32 values, read on every rank. modifier_rank=r: at exit the
    parameters whose values rank r changed are broadcast from r and written into the engine (its fp32
    master, which the optimizer updates, and every rank's shard), so the next forward and step see them;
    the other ranks' changes are dropped. modifier_rank=None: reading only; a change on any rank is an
    error at exit (it would be lost). Every rank enters and leaves it with the same parameters in the same
    order. Refused inside a forward or backward; the model's forward, engine.step() and
    engine.load_checkpoint() are refused inside it. Nested contexts: the outermost one that gathered a
    parameter writes it back (or checks it) and restores it. fwd_module (DeepSpeed's external parameters)
    has no use here; enabled=False makes it a no-op."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if fwd_module is not None:
            raise NotImplementedError("strata: GatheredParameters(fwd_module=...) registers DeepSpeed's "
                                      "external parameters; strata has none: a parameter is used by the unit "
                                      "that owns it (put modules sharing one in the root unit)")
        self.enabled = enabled
        self.modifier_rank = modifier_rank
        self.owners = _collect(params) if enabled else []
        self.mine = []    # (owner, dtype of the placeholder, digest at entry) of the parameters this context gathered
        self.nested = []  # the owners of those an outer context had gathered

    def __enter__(self):
        if not self.owners:
            return self
        engine = self.owners[0].engine
        if self.modifier_rank is not None and not 0 <= int(self.modifier_rank) < _comm.world_size():
            raise ValueError(f"strata: modifier_rank={self.modifier_rank} is not a rank of this job "
                             f"({_comm.world_size()} ranks)")
        _refuse_in_pass(engine, "st.GatheredParameters")
        s = _engines[engine]
        check = self.modifier_rank is None or _comm.rank() == self.modifier_rank
        try:
            # Note [A collective per unit]: a unit's listed parameters come from one gather, made when the first of
            # them is reached; those listed later wait here for their turn (values the context installs anyway).
            wanted, values = {}, {}
            for o in self.owners:
                if id(o.param) not in s.gathered:
                    wanted.setdefault(o.unit, []).append((o.unit, o.index))
            for o in self.owners:
                if id(o.param) in s.gathered:
                    s.gathered[id(o.param)] += 1
                    self.nested.append(o)
                    continue
                if (o.unit, o.index) not in values:
                    values.update(engine.gather_params(wanted.pop(o.unit)))
                full = values.pop((o.unit, o.index))
                digest = _digest(full) if check else None
                dtype = o.param.dtype
                set_values(o.param, full.to(engine.device))
                s.gathered[id(o.param)] = 1
                self.mine.append((o, dtype, digest))
        except BaseException:
            for o in self.nested:
                s.gathered[id(o.param)] -= 1
            self.nested = []
            self._restore(s)
            raise
        return self

    def _restore(self, s):
        for o, dtype, _ in self.mine:
            set_placeholder(o.param, dtype, o.engine.units[o.unit].layout.device)
            s.gathered.pop(id(o.param), None)
            tracker = getattr(o.engine, "tracker", None)
            if tracker is not None:  # edits made here went through the engine (Note [Writes outside a forward])
                tracker.versions[id(o.param)] = o.param._version
        self.mine = []

    def __exit__(self, kind, value, tb):
        if not self.owners:
            return False
        s = _engines[self.owners[0].engine]
        for o in self.nested:  # an outer context restores them
            s.gathered[id(o.param)] -= 1
        self.nested = []
        if kind is not None:  # the body raised: restore without collectives (the job is likely ending)
            self._restore(s)
            return False
        try:
            if self.modifier_rank is None:
                self._check_unchanged()
            else:
                self._write_back(int(self.modifier_rank))
        finally:
            self._restore(s)
        return False

    def _changed(self):
        return [o for o, _, digest in self.mine if _digest(o.param) != digest]

    def _check_unchanged(self):
        changed = _comm.allgather_object([o.name for o in self._changed()])
        if any(changed):
            where = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in enumerate(changed) if names)
            raise RuntimeError(f"strata: parameters changed inside st.GatheredParameters(modifier_rank=None) "
                               f"({where}); such changes are dropped at exit: pass modifier_rank=<the rank "
                               f"whose values to keep>")

    def _write_back(self, root):
        """Rank root's changed parameters into the engine on every rank."""
        if _comm.rank() == root:
            changed = {id(o.param) for o in self._changed()}
            plan = []
            for o, _, _ in self.mine:
                cur = o.param.detach()
                if id(o.param) not in changed:
                    plan.append(None)
                elif tuple(cur.shape) != o.shape:
                    plan.append(f"strata: parameter '{o.name}' was given the shape {tuple(cur.shape)} inside "
                                f"st.GatheredParameters on rank {root}; its shape is {o.shape}")
                else:
                    plan.append("set")
        else:
            plan = None
        plan = _comm.broadcast_object(plan, root)
        errors = [what for what in plan if what not in (None, "set")]
        if errors:
            raise RuntimeError("; ".join(errors))
        for (o, _, _), what in zip(self.mine, plan):
            if what != "set":
                continue
            full = o.param.detach().to("cpu", torch.float32).contiguous().clone() if _comm.rank() == root else \
                torch.empty(o.shape, dtype=torch.float32)
            _comm.broadcast(full, root)
            _set(o, full)
