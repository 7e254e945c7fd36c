"""Which modules are units, and which parameters each unit owns.

A unit is one flat buffer in the engine: gathered for its forward and backward, its gradients reduced
together. By default the units are the members of the model's transformer-block nn.ModuleList (the
ModuleList holding the most parameters); the parameters no unit owns form the root unit, which is live
for the whole forward and the whole backward (embeddings, final norm, a tied LM head).

Frozen parameters (requires_grad=False at shard()) are the engine's frozen units: gathered, never reduced
or updated, no gradient or optimizer memory. The engine's frozenness is per unit, so a module with both
kinds becomes two engine units, its trainable part (named as the module) and its frozen part (the name
with FROZEN_SUFFIX); the module's hooks begin and end both.
"""
import torch


FROZEN_SUFFIX = "[frozen]"


class UnitSpec:
    def __init__(self, name, module, names, params, prefix=None, frozen=False):
        self.name, self.module, self.names, self.params = name, module, names, params
        self.prefix = name if prefix is None else prefix  # the module's name in model.named_modules()
        self.frozen = frozen


def _split_frozen(spec):
    """[spec] when its parameters are all trainable or all frozen, else [trainable part, frozen part]."""
    frozen = [not p.requires_grad for p in spec.params]
    if not any(frozen):
        return [spec]
    if all(frozen):
        spec.frozen = True
        return [spec]
    parts = []
    for want, name in ((False, spec.name), (True, spec.name + FROZEN_SUFFIX)):
        names = [n for n, f in zip(spec.names, frozen) if f == want]
        params = [p for p, f in zip(spec.params, frozen) if f == want]
        parts.append(UnitSpec(name, spec.module, names, params, prefix=spec.prefix, frozen=want))
    return parts


def _block_list(model):
    best, best_count = None, 0
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0:
            count = sum(p.numel() for p in m.parameters())
            if count > best_count:
                best, best_count = m, count
    return [] if best is None else list(best)


def _unit_modules(model, unit_classes):
    if unit_classes is None:
        mods = _block_list(model)
    else:
        classes = tuple(unit_classes)
        mods, inside = [], set()
        for _, m in model.named_modules():  # outermost matches only: a unit inside a unit is part of it
            if isinstance(m, classes) and m is not model and id(m) not in inside:
                mods.append(m)
                inside.update(id(s) for s in m.modules())
    names = {id(m): n for n, m in model.named_modules()}
    return [(names[id(m)], m) for m in mods]


def split_units(model, unit_classes=None):
    """[UnitSpec]: the root unit first (if it has parameters), then the blocks in module order, each split
    into its trainable and frozen parts where it has both. A parameter shared by two units, or between a
    unit and the root, is refused: it must be one unit's."""
    owner = {}
    specs = []
    for uname, m in _unit_modules(model, unit_classes):
        names, params = [], []
        for n, p in m.named_parameters():
            if id(p) in owner:
                raise ValueError(f"strata: parameter '{uname}.{n}' is shared by units '{owner[id(p)]}' and "
                                 f"'{uname}'; a shared parameter must belong to one unit (put the modules "
                                 f"sharing it in the root unit)")
            owner[id(p)] = uname
            names.append(n)
            params.append(p)
        if params:
            specs.append(UnitSpec(uname, m, names, params))
    root_names, root_params = [], []
    for n, p in model.named_parameters():  # deduplicated: a tied parameter appears once, by its first name
        if id(p) not in owner:
            root_names.append(n)
            root_params.append(p)
    if root_params:
        specs.insert(0, UnitSpec("root", model, root_names, root_params))
    return [part for spec in specs for part in _split_frozen(spec)]
