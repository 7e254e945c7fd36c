"""DeepSpeed's `model_parameters` (an iterable of tensors, or of dicts with "params" and per-group options, as a
torch optimizer takes them) mapped onto what the engine does per parameter (Note [Param groups] in
runtime/optim/optimizer.cc, docs/decisions/0032-param-groups.md).

DeepSpeed builds its torch optimizer from the groups with the config's optimizer.params as the defaults, so a
group without "lr" or "weight_decay" takes the config's value. A group's own lr and weight_decay become each of
its parameters' own (strata.torch.shard's lr= and weight_decay=); weight_decay 0 is no decay. betas / eps /
momentum are one per engine: a group's value must equal the config's. Anything else is refused, naming the
group, the key and what to write instead, rather than trained with another value."""
import math
import numbers

import torch

# Group keys that are optimizer hyperparameters the engine has once: a group's value must equal the config's.
_SHARED = ("betas", "eps", "momentum")
_METADATA = ("name",)  # carried by some trainers (transformers' param group names); no effect on the update


def _same(a, b):
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def _unnamed(items):
    """torch's optimizers (2.5 and later) also take (name, parameter) pairs, as model.named_parameters() gives
    them: the parameters alone."""
    return [x[1] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor)
            else x for x in items]


def normalize(model, model_parameters):
    """The groups as a list of dicts with "params" a list; DeepSpeed's default (None) is model.parameters()."""
    if model_parameters is None:
        model_parameters = model.parameters()
    if isinstance(model_parameters, (torch.Tensor, dict)):
        model_parameters = [model_parameters]
    items = _unnamed(model_parameters)
    if not items:
        raise ValueError("strata.deepspeed.initialize: model_parameters is empty; pass model.parameters() or a "
                         "list of parameter groups")
    if all(isinstance(x, dict) for x in items):
        groups = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise ValueError(f"strata.deepspeed.initialize: model_parameters[{i}] has no 'params' key")
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else _unnamed(ps)
            groups.append({**g, "params": ps})
        return groups
    if any(isinstance(x, dict) for x in items):
        raise TypeError("strata.deepspeed.initialize: model_parameters mixes tensors and parameter-group dicts; "
                        "give either tensors or dicts with a 'params' key, as torch optimizers take them")
    return [{"params": items}]


def _own_value(i, key, value):
    """A group's own lr / weight_decay: a finite number >= 0, as torch.optim requires."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"strata.deepspeed.initialize: param group {i} has {key} {value!r}; it must be a finite "
                         f"number >= 0")
    return float(value)


def group_own_lr(i, group):
    """The group's own lr (None: it takes the config's)."""
    return _own_value(i, "lr", group["lr"]) if "lr" in group else None


def param_hyper(model, groups, optimizer_params):
    """{id(param): (weight_decay, own lr)} for every parameter of `model`: weight_decay as strata.torch.shard's
    weight_decay= takes it (True: the config's, False: none, a float: the group's own), the lr None or the group's
    own. Raises naming what the engine cannot honour exactly."""
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), n)
    hyper, where = {}, {}
    for i, g in enumerate(groups):
        for key, value in g.items():
            if key in ("params", "lr", "weight_decay") or key in _METADATA:
                continue
            if key in _SHARED:
                if key in optimizer_params and _same(value, optimizer_params[key]):
                    continue
                raise ValueError(
                    f"strata.deepspeed.initialize: param group {i} has its own {key} ({value}); the engine has one "
                    f"{key} for every parameter, the config's optimizer.params.{key} "
                    f"({optimizer_params.get(key, 'not set')}). Per-group {key} is not supported (per-group lr and "
                    f"weight_decay are): set it in the config and drop it from the group")
            raise ValueError(f"strata.deepspeed.initialize: param group {i} has the key '{key}', which the engine "
                             f"cannot apply per group (it takes 'params', 'lr', 'weight_decay' and the config's own "
                             f"{', '.join(_SHARED)}); move it to the config's optimizer.params")
        own_lr = group_own_lr(i, g)
        if "weight_decay" in g:
            wd = _own_value(i, "weight_decay", g["weight_decay"])
            decay = wd if wd != 0.0 else False
        else:
            decay = True  # the config's optimizer.params.weight_decay, DeepSpeed's default for a group
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError(f"strata.deepspeed.initialize: param group {i} holds a tensor of shape "
                                 f"{tuple(p.shape)} that is not a parameter of the model")
            if id(p) in hyper:
                raise ValueError(f"strata.deepspeed.initialize: parameter '{names[id(p)]}' is in param groups "
                                 f"{where[id(p)]} and {i}; a parameter belongs to one group")
            hyper[id(p)], where[id(p)] = (decay, own_lr), i
    for p in model.parameters():
        if p.requires_grad and id(p) not in hyper:
            raise ValueError(f"strata.deepspeed.initialize: parameter '{names[id(p)]}' requires grad but is in no "
                             f"group of model_parameters, so nothing would update it; the engine trains every "
                             f"parameter that requires grad. Add it to model_parameters, or set "
                             f"requires_grad=False on it before initialize (then it is frozen)")
        hyper.setdefault(id(p), (False, None))  # frozen: never updated, the values have no effect
    return hyper
