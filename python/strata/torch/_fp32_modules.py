"""The modules transformers keeps in fp32 under a half-precision load, kept in fp32 by strata.torch too.

Note [Modules kept in fp32].
transformers' PreTrainedModel names modules that must not compute in half precision: a model class's
_keep_in_fp32_modules_strict (DeepSeek-V3's router weight `gate.weight` and its `e_score_correction_bias`,
most MoE routers) applies under both bf16 and fp16, _keep_in_fp32_modules (T5's `wo`) under fp16 only
(transformers 5.x: PreTrainedModel._get_dtype_plan). from_pretrained(dtype=torch.bfloat16) then loads each
state-dict key that one of those globs matches (re.search, `*` as `.*`) in fp32 and the rest in bf16, and
the model's forward computes those modules in fp32. With a half-precision param dtype (bf16.enabled,
fp16.enabled, strata.param_dtype) strata.torch applies the same rule, read from the model itself:
  - a parameter with a matching name (its first name in model.named_parameters(): a tied weight by the name
    transformers writes and loads it under, e.g. the input embedding's and not a tied `lm_head`'s, so it
    takes the dtype transformers gives it) is computed from its
    fp32 master, exactly: its module's unit is split into the half-precision part and an fp32 part (named
    FP32_SUFFIX, as frozen parts are: Note [Frozen units] in runtime/engine/placement.h), and each use of
    the fp32 part takes the part's full fp32 master (strata_engine_gather_unit; at stages 0-2 a replicated
    copy refreshed where the master changes, so an evaluation forward stays local there) instead of the
    engine's half-precision gathered buffer. Its gradient is fp32, added straight into the engine's buffer.
  - a matching floating buffer stays in its dtype (not cast with the parameters: _model_buffers).
A frozen matching parameter stays in the param dtype, with a warning naming it (_engine._frozen_kept_in_half):
a frozen unit has no fp32 master, only its half-precision param storage. The config's
data_types.keep_in_fp32_modules (DeepSpeed's key) picks the names: "auto" (default) the model's lists as
above, a list of globs instead, [] none (every parameter in the param dtype, the behaviour before this rule).
docs/decisions/0045-modules-kept-in-fp32.md.
"""
import re

import torch

FP32_SUFFIX = "[fp32]"
OPTION = "data_types.keep_in_fp32_modules"
AUTO = "auto"


def take_option(config):
    """data_types.keep_in_fp32_modules (DeepSpeed's key; a front-end key, removed from the config the engine
    parses): "auto" (default: the model's own transformers lists), a list of patterns (transformers' globs,
    matched anywhere in a full parameter or buffer name), or [] (nothing kept in fp32)."""
    types = config.get("data_types")
    if not isinstance(types, dict) or "keep_in_fp32_modules" not in types:
        return AUTO
    value = types.pop("keep_in_fp32_modules")
    if not types:
        del config["data_types"]
    if value != AUTO and not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        raise ValueError(f"strata: config key '{OPTION}' must be \"auto\" or a list of name patterns (e.g. "
                         f"[\"gate.weight\"]; [] for none), not {value!r}")
    return value


def _enabled(block):
    return isinstance(block, dict) and block.get("enabled") is True


def param_dtype(config):
    """The parameters' compute dtype the config asks for (the engine checks the keys agree; Engine checks its
    reading against this one)."""
    strata = config.get("strata") if isinstance(config.get("strata"), dict) else {}
    named = strata.get("param_dtype")  # any case, with its aliases (runtime/engine/config.cc ParseDTypeKey)
    named = named.lower() if isinstance(named, str) else named
    if _enabled(config.get("fp16")) or named in ("fp16", "float16", "half"):
        return torch.float16
    if _enabled(config.get("bf16")) or named in ("bf16", "bfloat16"):
        return torch.bfloat16
    return torch.float32


def _plan(module, dtype):
    """The globs transformers keeps in fp32 for `module` (a PreTrainedModel) under `dtype`: its own
    _get_dtype_plan where it has one, else the 5.x rule (strict under bf16 and fp16, the other under fp16)."""
    get = getattr(module, "_get_dtype_plan", None)
    if callable(get):
        return [k for k, v in get(dtype).items() if v == torch.float32]
    globs = list(getattr(module, "_keep_in_fp32_modules_strict", None) or [])
    if dtype == torch.float16:
        globs += list(getattr(module, "_keep_in_fp32_modules", None) or [])
    return globs


def _declares(module):
    return any(getattr(module, a, None) is not None
               for a in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"))


class Rule:
    """Which parameters and buffers of a model are kept in fp32 under `dtype` (the module docstring); `setting`:
    take_option's value."""

    def __init__(self, model, dtype, setting=AUTO):
        self.matchers = []  # (prefix of the declaring model, its globs as one regex)
        if dtype not in (torch.bfloat16, torch.float16):
            return
        if setting != AUTO:
            if setting:
                self.matchers.append(("", re.compile("|".join(g.replace("*", ".*") for g in setting))))
            return
        inside = set()
        for prefix, m in model.named_modules():  # outermost declaring models: their plan covers the children
            if id(m) in inside or not _declares(m):
                continue
            inside.update(id(s) for s in m.modules())
            globs = _plan(m, dtype)
            if globs:  # transformers' build_glob_alternation: each glob with `*` as `.*`, searched anywhere
                self.matchers.append((prefix, re.compile("|".join(g.replace("*", ".*") for g in globs))))

    def __bool__(self):
        return bool(self.matchers)

    def matches(self, name):
        for prefix, regex in self.matchers:
            if not prefix:
                if regex.search(name):
                    return True
            elif name.startswith(prefix + ".") and regex.search(name[len(prefix) + 1:]):
                return True
        return False

    def params(self, model):
        """ids of the parameters whose first name matches. A tied parameter by its first name only: transformers'
        save_pretrained writes it once, under the tie's source (the first registered, e.g. the input embedding;
        the tied `lm_head.weight` is dropped), and from_pretrained gives it the dtype that name's match gives,
        so HY-V4's tied embedding is bf16 there though its list names lm_head."""
        return {id(p) for n, p in model.named_parameters() if self.matches(n)}

    def buffers(self, model):
        """ids of the floating buffers one of whose names matches."""
        return {id(b) for n, b in model.named_buffers(remove_duplicate=False)
                if b.is_floating_point() and self.matches(n)}
