"""DeepSpeed's `model_parameters` (an iterable of tensors, or of dicts with "params" and per-group options, as a
torch optimizer takes them) mapped onto what the engine can do: one optimizer from the config, and per parameter
a flag saying whether it decays by the config's `optimizer.params.weight_decay` (ParamSpec::weight_decay).

A group's option is honoured when that flag can express it exactly: weight_decay 0 (no decay) or the config's
value (decay), and lr / betas / eps / momentum equal to the config's. Anything else is refused, naming the group,
the key and what to write instead, rather than trained with another value."""
import torch

# Group keys that are optimizer hyperparameters: a group's value must equal the config's optimizer.params.
_HYPER = ("lr", "betas", "eps", "momentum")
_METADATA = ("name",)  # carried by some trainers (transformers' param group names); no effect on the update


def _same(a, b):
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def normalize(model, model_parameters):
    """The groups as a list of dicts with "params" a list; DeepSpeed's default (None) is model.parameters()."""
    if model_parameters is None:
        model_parameters = model.parameters()
    if isinstance(model_parameters, (torch.Tensor, dict)):
        model_parameters = [model_parameters]
    items = list(model_parameters)
    if not items:
        raise ValueError("strata.deepspeed.initialize: model_parameters is empty; pass model.parameters() or a "
                         "list of parameter groups")
    if all(isinstance(x, dict) for x in items):
        groups = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise ValueError(f"strata.deepspeed.initialize: model_parameters[{i}] has no 'params' key")
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            groups.append({**g, "params": ps})
        return groups
    if any(isinstance(x, dict) for x in items):
        raise TypeError("strata.deepspeed.initialize: model_parameters mixes tensors and parameter-group dicts; "
                        "give either tensors or dicts with a 'params' key, as torch optimizers take them")
    return [{"params": items}]


def decay_flags(model, groups, optimizer_params):
    """{id(param): decays} for every parameter of `model`, from the groups and the config's optimizer.params;
    raises naming what the engine cannot honour exactly."""
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), n)
    config_wd = optimizer_params.get("weight_decay")
    flags, where = {}, {}
    for i, g in enumerate(groups):
        for key, value in g.items():
            if key == "params" or key in _METADATA:
                continue
            if key == "weight_decay":
                if float(value) == 0.0 or (config_wd is not None and _same(value, config_wd)):
                    continue
                have = (f"the config's optimizer.params.weight_decay is {config_wd}" if config_wd is not None
                        else "the config sets no optimizer.params.weight_decay")
                raise ValueError(
                    f"strata.deepspeed.initialize: param group {i} has weight_decay {value}, and {have}. The "
                    f"engine decays each parameter by the config's value or not at all: set "
                    f"optimizer.params.weight_decay to {value} in the config, or give this group weight_decay 0.0")
            if key in _HYPER:
                if key in optimizer_params and _same(value, optimizer_params[key]):
                    continue
                raise ValueError(
                    f"strata.deepspeed.initialize: param group {i} has its own {key} ({value}); the engine has one "
                    f"{key} for every parameter, the config's optimizer.params.{key} "
                    f"({optimizer_params.get(key, 'not set')}). Per-group {key} is not supported: set it in the "
                    f"config and drop it from the group")
            else:
                raise ValueError(f"strata.deepspeed.initialize: param group {i} has the key '{key}', which the engine "
                                 f"cannot apply per group (it takes 'params', 'weight_decay' and the config's own "
                                 f"{', '.join(_HYPER)}); move it to the config's optimizer.params")
        decays = "weight_decay" not in g or float(g["weight_decay"]) != 0.0
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError(f"strata.deepspeed.initialize: param group {i} holds a tensor of shape "
                                 f"{tuple(p.shape)} that is not a parameter of the model")
            if id(p) in flags:
                raise ValueError(f"strata.deepspeed.initialize: parameter '{names[id(p)]}' is in param groups "
                                 f"{where[id(p)]} and {i}; a parameter belongs to one group")
            flags[id(p)], where[id(p)] = decays, i
    for p in model.parameters():
        if p.requires_grad and id(p) not in flags:
            raise ValueError(f"strata.deepspeed.initialize: parameter '{names[id(p)]}' requires grad but is in no "
                             f"group of model_parameters, so nothing would update it; the engine trains every "
                             f"parameter that requires grad. Add it to model_parameters, or set "
                             f"requires_grad=False on it before initialize (then it is frozen)")
        flags.setdefault(id(p), False)  # frozen: never updated, the flag has no effect
    return flags
