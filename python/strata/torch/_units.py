"""Which modules are units, and which parameters each unit owns.

A unit is one flat buffer in the engine: gathered for its forward and backward, its gradients reduced
together. By default the units are the members of the model's transformer-block nn.ModuleList (the
ModuleList holding the most parameters) and the large leaf modules outside it (Note [Leaf units]); the
parameters no unit owns form the root unit, which is live for the whole forward and the whole backward
(a tied embedding and LM head, position embeddings, the final norm).

Frozen parameters (requires_grad=False at shard()) are the engine's frozen units: gathered, never reduced
or updated, no gradient or optimizer memory. The engine's frozenness is per unit, so a module with both
kinds becomes two engine units, its trainable part (named as the module) and its frozen part (the name
with FROZEN_SUFFIX); the module's hooks begin and end both. Likewise a module with parameters kept in fp32
under a half-precision param dtype (Note [Modules kept in fp32] in _fp32_modules) becomes two units, the kept
ones the part named with FP32_SUFFIX.
"""
import torch

from strata.torch._fp32_modules import FP32_SUFFIX

FROZEN_SUFFIX = "[frozen]"


class UnitSpec:
    def __init__(self, name, module, names, params, prefix=None, frozen=False, leaf=False, fp32=False):
        self.name, self.module, self.names, self.params = name, module, names, params
        self.prefix = name if prefix is None else prefix  # the module's name in model.named_modules()
        self.frozen = frozen
        self.leaf = leaf  # a unit of Note [Leaf units]: an nn.Embedding or nn.Linear outside the blocks
        self.fp32 = fp32  # computed from its fp32 master (Note [Modules kept in fp32] in _fp32_modules)


def _split(spec, flags, attr, suffix):
    """[spec] with spec.<attr> = all(flags) when the flags (one per parameter) are all alike, else [the part
    without the flag (named as spec), the part with it (named with `suffix`)]."""
    if all(flags) or not any(flags):
        setattr(spec, attr, getattr(spec, attr) or all(flags))
        return [spec]
    parts = []
    for want, name in ((False, spec.name), (True, spec.name + suffix)):
        part = UnitSpec(name, spec.module, [n for n, f in zip(spec.names, flags) if f == want],
                        [p for p, f in zip(spec.params, flags) if f == want], prefix=spec.prefix,
                        frozen=spec.frozen, leaf=spec.leaf, fp32=spec.fp32)
        setattr(part, attr, want)
        parts.append(part)
    return parts


def _split_frozen(spec):
    """[spec] when its parameters are all trainable or all frozen, else [trainable part, frozen part]."""
    return _split(spec, [not p.requires_grad for p in spec.params], "frozen", FROZEN_SUFFIX)


def _split_fp32(spec, kept):
    """[spec] when none or all of its parameters are kept in fp32 (ids in `kept`), else [the rest, the kept]."""
    return _split(spec, [id(p) in kept for p in spec.params], "fp32", FP32_SUFFIX)


def _block_list(model):
    best, best_count = None, 0
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0:
            count = sum(p.numel() for p in m.parameters())
            if count > best_count:
                best, best_count = m, count
    return [] if best is None else list(best)


# Note [Leaf units].
# By default the parameters outside the blocks were all the root unit's, and the root is live (gathered, and
# in backward its fp32 gradient buffer) from the first forward to the end of the backward, so it sizes the
# engine's pools (decision 0019: an outsized unit gets a slot of its own; a small one still takes a shared
# slot of the largest size for the whole step, as max_live_units counts units). An untied model's embedding
# and LM head are each larger than a decoder layer (Llama 1.5B: 2 x 65.5M elements against 45.1M), so its
# root was 131M elements, 524 MB in fp32, live the whole step in both pools. So, with the default units
# (unit_classes None), a module outside the blocks is a unit of its own when it is
#   - a leaf reached by one path whose parameters are its own and no other module's (a tied embedding and LM
#     head stay in the root: one parameter is one unit's; a module called from two places, T5's shared
#     embedding, is begun once per use and stays there too), and
#   - an nn.Embedding or an nn.Linear (their forward uses every parameter they own, inside the module's call,
#     so the unit's hooks bracket every use) at least as large as the smallest block (a smaller one costs less
#     in the root than a unit's gather, reduction and place in the pools: GPT-2's wpe, BERT's token types).
# And when the parameters outside the blocks are a language model's, lone leaves of any size that are one
# nn.Embedding, at most one nn.Linear and norms (leaves whose parameters are all 1-D), each of them is a unit
# and there is no root at all: an untied Llama's embedding, final norm and head, as torchtitan shards
# tok_embeddings, norm and output apart from the layers. Anything else keeps its root: the root is where a
# module that runs on some ranks or some steps only must be (a per-rank head, a conditional branch), and where
# code outside a module may read one of its parameters (its dtype) while the root is gathered. Without a root
# the default strata.max_live_units is 2 (a unit and the next prefetched), not 3, as no unit holds a slot for
# the whole step. Units are ordered as the modules. Their forward is hooked as a block's. An embedding's input
# needs no gradient, so no Function marks the end of its backward (_hooks._arm_post_backward): that use ends
# with the pass (where an input embedding's backward is anyway). With unit_classes given, the units are
# exactly the modules of those classes. docs/decisions/0040-leaf-units-and-gradients-in-backward.md.
_LEAF_TYPES = (torch.nn.Embedding, torch.nn.Linear)


def _leaf_units(model, blocks):
    """The modules of Note [Leaf units] among model's modules outside `blocks`, in module order."""
    if not blocks:
        return []
    inside = {id(s) for m in blocks for s in m.modules()}
    smallest = min((n for n in (sum(p.numel() for p in m.parameters()) for m in blocks) if n > 0), default=0)
    if smallest == 0:
        return []
    paths, holders = {}, {}
    for _, m in model.named_modules(remove_duplicate=False):
        paths[id(m)] = paths.get(id(m), 0) + 1
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                holders.setdefault(id(p), set()).add(id(m))

    def alone(m):  # a leaf reached by one path whose parameters are its own and no other module's
        own = list(m.parameters())
        return paths[id(m)] == 1 and bool(own) and all(holders[id(p)] == {id(m)} for p in own)

    def owns(m):  # a module holding a parameter itself (an entry may be None: Linear(bias=False)'s bias)
        return any(p is not None for p in m._parameters.values())

    outside = [m for m in model.modules() if id(m) not in inside and m is not model and owns(m)]
    large = [m for m in outside if isinstance(m, _LEAF_TYPES) and alone(m) and
             sum(p.numel() for p in m.parameters()) >= smallest]
    # No root at all when the parameters outside the blocks are a language model's: one embedding, at most one
    # Linear (the head) and lone norms (leaves whose parameters are all 1-D), each a lone leaf
    whole = [m for m in outside
             if alone(m) and (isinstance(m, _LEAF_TYPES) or all(p.ndim == 1 for p in m.parameters()))]
    embeddings = sum(isinstance(m, torch.nn.Embedding) for m in whole)
    linears = sum(isinstance(m, torch.nn.Linear) for m in whole)
    if len(whole) == len(outside) and not owns(model) and embeddings == 1 and linears <= 1:
        return whole
    return large


def _unit_modules(model, unit_classes):
    if unit_classes is None:
        mods = _block_list(model)
        leaf_ids = {id(m) for m in _leaf_units(model, mods)}
        if leaf_ids:  # in module order among the blocks
            chosen = leaf_ids | {id(m) for m in mods}
            mods = [m for m in model.modules() if id(m) in chosen]
    else:
        classes = tuple(unit_classes)
        mods, inside = [], set()
        for _, m in model.named_modules():  # outermost matches only: a unit inside a unit is part of it
            if isinstance(m, classes) and m is not model and id(m) not in inside:
                mods.append(m)
                inside.update(id(s) for s in m.modules())
        leaf_ids = set()
    names = {id(m): n for n, m in model.named_modules()}
    return [(names[id(m)], m, id(m) in leaf_ids) for m in mods]


def split_units(model, unit_classes=None, kept_fp32=frozenset()):
    """[UnitSpec]: the root unit first (if it has parameters), then the blocks and the leaf units (Note [Leaf
    units]) in module order, each split into its trainable and frozen parts where it has both, and each part
    into its half-precision and fp32 parts where some of its parameters (ids in `kept_fp32`) are kept in fp32
    (Note [Modules kept in fp32] in _fp32_modules). A parameter
    shared by two units, or between a unit and the root, is refused: it must be one unit's."""
    owner = {}
    specs = []
    for uname, m, leaf in _unit_modules(model, unit_classes):
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
            specs.append(UnitSpec(uname, m, names, params, leaf=leaf))
    root_names, root_params = [], []
    for n, p in model.named_parameters():  # deduplicated: a tied parameter appears once, by its first name
        if id(p) not in owner:
            root_names.append(n)
            root_params.append(p)
    if root_params:
        specs.insert(0, UnitSpec("root", model, root_names, root_params))
    return [fp for spec in specs for part in _split_frozen(spec) for fp in _split_fp32(part, kept_fp32)]


def root_holders(model, root_params):
    """[(name, module)]: the modules other than the model whose parameters, their own or their submodules', include
    one of `root_params` (the root unit's), each once, in module order: those Note [The root outside the forward]
    (in _hooks) hooks. A unit's module is never one (a unit owns every parameter under its module)."""
    ids = {id(p) for p in root_params}
    names = set()
    for name, m in model.named_modules(remove_duplicate=False):  # a module reached by two paths: both
        if name and any(p is not None and id(p) in ids for p in m._parameters.values()):
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    chosen = {id(m) for name, m in model.named_modules(remove_duplicate=False) if name in names}
    return [(name, m) for name, m in model.named_modules() if id(m) in chosen and m is not model]
