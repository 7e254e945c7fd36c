"""A sharded parameter between uses: every torch call that would read or write its values is refused.

Note [Parameters between uses]. Outside its unit's forward and backward (and outside st.GatheredParameters)
a sharded parameter is an empty placeholder (_buffers.placeholder: shape (0,), as DeepSpeed ZeRO-3's) and its
values live in the engine. Torch would happily compute on the placeholder: p.sum() is 0, p.norm() 0,
p.clone() empty, p.data.zero_() or nn.init.normal_(p.data) write into nothing (p.data has its own version
counter, so Note [Writes outside a forward] cannot see them), model.zero_grad() drops the .grad markers of
gradients the engine goes on to apply, and model.half() or model.to(device) change only placeholders. All of
that was silently wrong. So while it is a placeholder the parameter's class is ShardedParameter (a subclass of
its own class, made once per class: isinstance(p, nn.Parameter) holds) whose __torch_function__:

- lets metadata through: attribute reads (p.shape (0,), p.dtype, p.device, p.requires_grad, p.grad, p.is_leaf),
  size/dim/numel/stride/data_ptr, hashing, requires_grad_ and hook registration, new_* constructors;
- gives a marker for p.data and p.detach() (a ShardedData: empty, its metadata readable, every op refused),
  so model.state_dict()'s p.detach() still works (its post-hook replaces the entry by the full value);
- refuses an op that writes it (an in-place op, nn.init, p[i] = v, p.data = t, `out=p`), naming the
  parameter and st.GatheredParameters(params, modifier_rank=0), whose edit reaches the engine;
- refuses any other op (a read), naming st.GatheredParameters(params) and model.state_dict();
- refuses p.grad = None while the .grad is a marker (between a backward and engine.step(): the engine
  cannot drop gradients it has reduced), and any .grad set by hand (the engine would not use it);
- repr() describes the parameter (its name and real shape) instead of printing an empty tensor.

A gathered parameter (inside its unit's forward or backward, or st.GatheredParameters) has its own class
back (set_values), so ops on it cost nothing extra. Module._apply (model.to, .half(), .double(), .cuda(),
...) is guarded at the module (guard_apply): it would change the placeholders only, so a change of dtype or
device is refused before anything (buffers included) changes; a call that changes nothing runs as torch's.
The engine's own code reaches the parameters under torch._C.DisableTorchFunction, which none of this sees.
docs/decisions/0030-sharded-parameters-outside-a-forward.md.
"""
import functools
import threading

import torch

from strata.torch._buffers import _TORCH_DTYPE, placeholder

_VIEWS = frozenset(("data", "T", "mT", "H", "mH", "real", "imag"))  # attribute reads that are views of the values
_METADATA = frozenset((
    "size", "dim", "ndimension", "numel", "nelement", "element_size", "is_floating_point", "is_complex",
    "is_signed", "is_contiguous", "stride", "storage_offset", "get_device", "data_ptr", "untyped_storage",
    "is_shared", "is_pinned", "__len__", "__hash__", "__dir__", "requires_grad_", "retain_grad", "register_hook",
    "register_post_accumulate_grad_hook", "_has_compatible_shallow_copy_type", "new_empty", "new_zeros",
    "new_ones", "new_full", "new_tensor", "new_empty_strided"))
_IN_PLACE_DUNDERS = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                               "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                               "__irshift__", "__imatmul__"))
_applying = threading.local()  # inside a guarded Module._apply that changes nothing: torch's own calls go through


def _name_of(p):
    """The parameter's model.named_parameters() name (or a description when no engine knows it)."""
    from strata.torch._gathered import owner  # noqa: PLC0415  (_gathered imports this module)
    o = owner(p)  # raises when its engine was closed: that is the message then
    return o.name if o is not None else "<a sharded parameter>"


def _op_name(func):
    name = getattr(func, "__name__", None) or str(func)
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch.nn.init"):
        return f"nn.init.{name}"
    return name


def _writes(func, args, kwargs, p):
    name = getattr(func, "__name__", "")
    base = name.split(".")[0]  # torch.ops overloads: "zero_.default"
    if name in _IN_PLACE_DUNDERS or (base.endswith("_") and not base.startswith("__")):
        return True
    out = kwargs.get("out")
    return out is p or (isinstance(out, (list, tuple)) and any(t is p for t in out))


def write_message(name, what):
    return (f"strata: parameter '{name}' is sharded: outside its unit's forward it is an empty placeholder and its "
            f"values live in the engine, so {what} would write into nothing and would be lost. Edit it inside "
            f"`with st.GatheredParameters(params, modifier_rank=0):` (the edit then reaches every rank's shard and the "
            f"optimizer's fp32 copy), or set the values before st.shard()")


def read_message(name, what):
    return (f"strata: parameter '{name}' is sharded: outside its unit's forward it is an empty placeholder and its "
            f"values live in the engine, so {what} would read no values (a sum would be 0). Read it inside "
            f"`with st.GatheredParameters(params):` (its full fp32 values, on every rank), or from model.state_dict() "
            f"or engine.full_state_dict() (collective)")


ZERO_GRAD_MESSAGE = (
    "strata: model.zero_grad() (or p.grad = None) between a backward and engine.step(): the engine already "
    "holds this step's gradients, reduced across ranks (the .grad of '{name}' says so), and cannot drop them, so "
    "the next engine.step() would apply them anyway. Call zero_grad() before the forward or after engine.step() "
    "(the engine zeroes the gradients there: zero_grad() is then a no-op, as in torch), or leave it out")


def _describe(p):
    from strata.torch._gathered import owner  # noqa: PLC0415
    try:
        o = owner(p)
    except RuntimeError as e:
        return f"<{e}>"
    if o is None:
        return "<a sharded parameter>"
    return (f"<strata: sharded parameter '{o.name}' of shape {o.shape}: its values live in the engine; read them "
            f"inside st.GatheredParameters or from model.state_dict()>")


def _attribute(func):
    return getattr(getattr(func, "__self__", None), "__name__", None)


def _handle(func, args, kwargs, p):
    """ShardedParameter.__torch_function__ for `p`, the placeholder among the arguments."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        attr = _attribute(func)
        if attr == "data":
            return _marker(args[0])
        if attr in _VIEWS:
            raise RuntimeError(read_message(_name_of(p), f"p.{attr}"))
        return None
    if name in ("__set__", "__delete__"):
        attr = _attribute(func)
        if attr == "data":
            raise RuntimeError(write_message(_name_of(p), "an assignment to p.data"))
        if attr == "grad":
            _check_grad_assignment(args[0], args[1] if name == "__set__" else None)
        return None
    if name in ("__repr__", "__format__"):
        return _describe(p)
    if name == "detach":
        return _marker(args[0])
    if name in _METADATA or (name == "type" and len(args) == 1 and not kwargs):
        return None
    if _writes(func, args, kwargs or {}, p):
        raise RuntimeError(write_message(_name_of(p), f"'{_op_name(func)}'"))
    raise RuntimeError(read_message(_name_of(p), f"'{_op_name(func)}'"))


def _check_grad_assignment(p, value):
    from strata.torch._gathered import GradInEngine  # noqa: PLC0415
    with torch._C.DisableTorchFunction():
        current = p.grad
    if value is current:
        return
    if value is None and type(current) is GradInEngine:
        raise RuntimeError(ZERO_GRAD_MESSAGE.format(name=_name_of(p)))
    if value is not None:
        raise RuntimeError(f"strata: parameter '{_name_of(p)}' is sharded: its gradients live in the engine, so a "
                           f".grad set by hand would not be used. The engine computes them in the backward and "
                           f"applies them in engine.step()")


def _find(obj, cls):
    """The first instance of `cls` in an op's arguments (lists, tuples and dicts looked into)."""
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for v in obj:
            found = _find(v, cls)
            if found is not None:
                return found
    return None


class ShardedParameter(torch.nn.Parameter):
    """The class of a sharded parameter between uses (Note [Parameters between uses]); sharded_class(cls)
    derives one from this and a subclass of nn.Parameter."""

    _strata_base = torch.nn.Parameter

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not applying():
            from strata.torch._gathered import GradInEngine  # noqa: PLC0415
            if _find((args, kwargs), GradInEngine) is not None:
                return NotImplemented  # an op on a gradient marker: its message (Note [Gradients in the engine])
            handled = _handle(func, args, kwargs, _find((args, kwargs), ShardedParameter))
            if handled is not None:
                return handled
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


_classes = {torch.nn.Parameter: ShardedParameter}


def sharded_class(cls):
    """ShardedParameter for nn.Parameter; for a subclass of it, a class deriving from both (made once)."""
    if issubclass(cls, ShardedParameter):
        return cls
    if cls not in _classes:
        _classes[cls] = type(f"Sharded{cls.__name__}", (ShardedParameter, cls), {"_strata_base": cls})
    return _classes[cls]


class ShardedData(torch.Tensor):
    """p.data and p.detach() of a sharded parameter between uses: empty, metadata readable, every op refused
    naming the parameter (a write as a write)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name == "__get__" and _attribute(func) not in _VIEWS) or name in _METADATA or \
                (name == "type" and len(args) == 1 and not kwargs):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        m = _find((args, kwargs), ShardedData)
        if name in ("__repr__", "__format__"):
            return _describe(m._strata_param)
        what = f"'{_op_name(func)}' on p.data (or p.detach())"
        if name == "__set__" or _writes(func, args, kwargs, m):
            raise RuntimeError(write_message(_name_of(m._strata_param), what))
        raise RuntimeError(read_message(_name_of(m._strata_param), what))


def _marker(p):
    with torch._C.DisableTorchFunction():
        m = p.detach().as_subclass(ShardedData)
    m._strata_param = p
    return m


# ---- the switch, at each use ----
def set_placeholder(p, dtype, device):
    """p becomes an empty placeholder of `dtype` on `device` (None: the host), its class ShardedParameter."""
    with torch._C.DisableTorchFunction():
        p.data = placeholder(dtype, device)
    p.__class__ = sharded_class(type(p))


def set_values(p, value):
    """p becomes `value` (a view of a gathered buffer, or a full tensor), its own class back."""
    with torch._C.DisableTorchFunction():
        p.data = value
    cls = type(p)
    if issubclass(cls, ShardedParameter):
        p.__class__ = cls._strata_base


# ---- Module._apply: model.to, .half(), .double(), .cuda(), ... ----
def applying():
    """Inside a Module._apply that changes neither dtype nor device of the parameters (torch's own calls on
    placeholders and .grad markers then go through)."""
    return getattr(_applying, "on", False)


def guard_apply(engine):
    """Every module of engine.model: a Module._apply that would change the dtype or the device of the engine's
    parameters is refused before it changes anything (Note [Parameters between uses])."""
    compute = {id(p): _TORCH_DTYPE[u.layout.dtype][0] for u in engine.units for p in u.spec.params}
    names = {id(m): n for n, m in engine.model.named_modules()}
    for m in engine.model.modules():
        if "_apply" not in m.__dict__:  # once per module (a module shared by two places is met once)
            m._apply = functools.partial(_guarded_apply, engine, m, m._apply, compute, names.get(id(m), ""))


def _guarded_apply(engine, module, inner, compute, name, fn, recurse=True):
    where = f" (on '{name}')" if name else ""
    for dtype in sorted({compute[id(p)] for p in module.parameters(recurse=recurse) if id(p) in compute}, key=str):
        probe = torch.empty(0, dtype=dtype, device=engine.device)
        out = fn(probe)
        if not isinstance(out, torch.Tensor):
            continue
        if out.dtype != dtype:
            raise RuntimeError(
                f"strata: a call of Module._apply (model.to(), .half(), .double(), .bfloat16(), .float()){where} after "
                f"st.shard() would change the parameters' dtype from {str(dtype)[6:]} to {str(out.dtype)[6:]}; a "
                f"sharded model's parameters belong to the engine, which keeps an fp32 master and computes in the "
                f"dtype of its config, so the change would be ignored. Nothing was changed. To compute in bf16, set "
                f"it in the config before st.shard() (\"bf16\": {{\"enabled\": true}} or strata.param_dtype) and give "
                f"shard() the fp32 model")
        if out.device != probe.device:
            raise RuntimeError(
                f"strata: a call of Module._apply (model.to(), .cuda(), .cpu()){where} after st.shard() would move the "
                f"parameters from {probe.device} to {out.device}; a sharded model's parameters are the engine's "
                f"buffers, which stay where st.shard() put them, so the move would be ignored. Nothing was changed. "
                f"Move the model before st.shard(), or pass st.shard(model, device=...)")
    was, _applying.on = getattr(_applying, "on", False), True
    try:
        return inner(fn, recurse)
    finally:
        _applying.on = was
