"""engine.save_pretrained(dir): the model in Hugging Face's layout, written one unit at a time.

Note [Streaming export]. The file layout is transformers' save_pretrained's: safetensors files of at most
`max_shard_size` bytes (`model-00001-of-00003.safetensors` ... with `model.safetensors.index.json`, or one
`model.safetensors` when everything fits), each with {"format": "pt"} metadata, plus config.json (and
generation_config.json) for a transformers model; so transformers' from_pretrained and the safetensors
package read it. The names are the ones transformers would write: tied names once (its
remove_tied_weights_from_state_dict keeps the name a reload expects: GPT-2's transformer.wte.weight, not
lm_head.weight) and, for models whose checkpoint format differs from their modules (transformers 5 fuses
Mixtral's experts and renames ViT's attention), its revert_weight_conversion. With trainable_only=True only the
trainable parameters are written and the frozen units are never gathered; for a peft model that is the
adapter in peft's layout (adapter_model.safetensors with peft's names, and adapter_config.json), which
PeftModel.from_pretrained loads.

The plan comes first, from shapes alone: every output tensor's name, shape, dtype, file and offset, so each
file's header is known before any value is. The conversion is planned on meta tensors, unit by unit, and
checked against the whole model's (a conversion that spans two units is refused: it could not stream). Then
the units are gathered in engine order (strata_engine_gather_unit: one collective per unit), converted and
written, and freed: no rank holds more than one unit's full tensors. The files are written
by rank (file k by rank k mod world size), each to a temporary name, fsynced and renamed; rank 0 writes the
index and the configs last, and removes the files of an earlier export that this one does not replace (a
stale model.safetensors beside a new index would be loaded instead of it). A failure on any rank is an error
on every rank naming it, after the others finished the collective gathers (no rank is left waiting).
docs/decisions/0034-models-created-sharded.md.
"""
import json
import os
import re

import torch

from strata import _comm
from strata.torch import _deferred
from strata.torch._model_buffers import _NAMES as _SAFETENSORS_DTYPES

SAFE_NAME, INDEX_NAME = "model.safetensors", "model.safetensors.index.json"
ADAPTER_NAME = "adapter_model.safetensors"
_UNITS = {"TB": 10 ** 12, "GB": 10 ** 9, "MB": 10 ** 6, "KB": 10 ** 3,
          "TIB": 2 ** 40, "GIB": 2 ** 30, "MIB": 2 ** 20, "KIB": 2 ** 10}


def parse_size(size):
    """Bytes from an int or a string such as "5GB" (10^9, as huggingface_hub) or "512MiB" (2^20)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]I?B)\s*", str(size), re.I)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"strata: max_shard_size {size!r}: give a positive number of bytes or a size such as "
                         f"\"5GB\" or \"512MiB\"")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


class _Out:
    """One tensor of the export: where it goes."""
    __slots__ = ("name", "shape", "dtype", "nbytes", "file", "offset")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype
        self.nbytes = dtype.itemsize * int(torch.Size(shape).numel())
        self.file = self.offset = None


class _Group:
    """The state-dict entries of one engine unit (or the buffers), and the tensors they become."""

    def __init__(self, unit, sources):
        self.unit, self.sources = unit, sources  # [(name, (unit, index), or the buffer itself)]
        self.outs = []


def _transformers_model(model):
    try:
        from transformers import PreTrainedModel  # noqa: PLC0415
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def _peft_model(model):
    try:
        from peft import PeftModel  # noqa: PLC0415
    except ImportError:
        return False
    return isinstance(model, PeftModel)


class _Layout:
    """What the exported names are: kept (the state-dict names written, after ties and ignored keys) and
    convert(sub): {source name: tensor} of one group -> {exported name: tensor}."""

    def __init__(self, model, entries, meta, trainable_only):
        self.model = model
        self.convert = lambda sub: dict(sub)
        self.weights_name, self.adapter = SAFE_NAME, None
        if trainable_only and _peft_model(model):
            from peft.utils import get_peft_model_state_dict  # noqa: PLC0415
            self.adapter = model.active_adapter
            renamed = get_peft_model_state_dict(model, state_dict=dict(meta), adapter_name=self.adapter)
            source = {id(t): n for n, t in meta.items()}
            rename = {out: source[id(t)] for out, t in renamed.items()}
            self.kept = sorted(set(rename.values()), key=list(meta).index)
            self.convert = lambda sub: {out: sub[src] for out, src in rename.items() if src in sub}
            self.weights_name = ADAPTER_NAME
        elif _transformers_model(model):
            from transformers.modeling_utils import remove_tied_weights_from_state_dict  # noqa: PLC0415
            for key in model._keys_to_ignore_on_save or ():
                meta.pop(key, None)
            self.kept = [n for n in remove_tied_weights_from_state_dict(dict(meta), model) if n in meta]
            try:
                from transformers.core_model_loading import revert_weight_conversion  # noqa: PLC0415
            except ImportError:
                revert_weight_conversion = None
            if revert_weight_conversion is not None:
                self.convert = lambda sub: revert_weight_conversion(model, dict(sub))
        else:  # safetensors holds no aliases: a tied parameter under its first name
            seen, self.kept = set(), []
            for n, t in entries.items():
                if id(t) not in seen:
                    seen.add(id(t))
                    self.kept.append(n)
        self.meta = meta


def _plan(engine, trainable_only, dtype):
    model = engine.model
    where = {id(p): (u.id, i) for u in engine.units for i, p in enumerate(u.spec.params)}
    frozen = {u.id for u in engine.units if u.spec.frozen}
    entries = {}
    for name, t in model.state_dict(keep_vars=True).items():  # the Parameters themselves: nothing gathered
        if not isinstance(t, torch.Tensor):
            continue
        if trainable_only and (id(t) not in where or where[id(t)][0] in frozen):
            continue
        entries[name] = t
    shapes = {id(p): u.layout.shapes[i] for u in engine.units for i, p in enumerate(u.spec.params)}
    meta = {n: torch.empty(shapes.get(id(t), t.shape), dtype=torch.float32 if id(t) in where else t.dtype,
                           device="meta") for n, t in entries.items()}  # a parameter: its fp32 master
    if not entries:
        raise ValueError("strata: save_pretrained(trainable_only=True): the model has no trainable parameters"
                         if trainable_only else "strata: save_pretrained: the model's state_dict is empty")
    layout = _Layout(model, entries, meta, trainable_only)
    groups = {}
    for name in layout.kept:
        t = entries[name]
        key = where[id(t)][0] if id(t) in where else len(engine.units)  # the buffers: one group, last
        groups.setdefault(key, _Group(key, [])).sources.append((name, where.get(id(t), t)))
    groups = [groups[k] for k in sorted(groups)]
    # Note [Modules kept in fp32] (_fp32_modules): what transformers keeps in fp32 is written in fp32 whatever
    # `dtype`, as transformers' save of its own half-precision model writes it
    fp32_units = {u.id for u in engine.units if u.spec.fp32}
    fp32_buffers = {n for n in layout.kept if id(entries[n]) in engine.model_buffers.kept}
    whole = {}
    for g in groups:
        sub = {n: layout.meta[n] for n, _ in g.sources}
        for out, m in layout.convert(sub).items():
            out_dtype = dtype if dtype is not None and m.dtype.is_floating_point else m.dtype
            if out_dtype != m.dtype and (g.unit in fp32_units or out in fp32_buffers):
                out_dtype = m.dtype
            if out_dtype not in _SAFETENSORS_DTYPES:
                raise ValueError(f"strata: save_pretrained: '{out}' is {out_dtype}, which safetensors cannot hold")
            g.outs.append(_Out(out, m.shape, out_dtype))
            whole[out] = tuple(m.shape)
    if layout.adapter is None:  # the conversion of the whole model: the same tensors as unit by unit
        planned = {out: tuple(m.shape) for out, m in layout.convert({n: layout.meta[n] for n in layout.kept}).items()}
        if planned != whole:
            raise NotImplementedError(
                f"strata: save_pretrained: transformers' conversion of this model's names to its checkpoint format "
                f"combines tensors of different units ({sorted(planned.keys() ^ whole.keys())[:4]}), so it cannot be "
                f"written one unit at a time; use model.save_pretrained() (collective, every rank holding the model)")
    return layout, groups


def _split(groups, max_bytes, weights_name):
    """Files [(file name, [_Out])] in write order: consecutive tensors up to max_bytes each (a larger tensor
    has a file of its own), named as transformers names them."""
    files, current, size = [], [], 0
    for out in (o for g in groups for o in g.outs):
        if current and size + out.nbytes > max_bytes:
            files.append(current)
            current, size = [], 0
        current.append(out)
        size += out.nbytes
    files.append(current)
    stem, ext = weights_name.rsplit(".", 1)
    names = [weights_name] if len(files) == 1 else \
        [f"{stem}-{i + 1:05d}-of-{len(files):05d}.{ext}" for i in range(len(files))]
    for name, outs in zip(names, files):
        offset = 0
        for o in outs:
            o.file, o.offset = name, offset
            offset += o.nbytes
    return list(zip(names, files))


def _header(outs):
    h = {"__metadata__": {"format": "pt"}}
    for o in outs:
        h[o.name] = {"dtype": _SAFETENSORS_DTYPES[o.dtype], "shape": list(o.shape),
                     "data_offsets": [o.offset, o.offset + o.nbytes]}
    text = json.dumps(h, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)  # the data 8-byte aligned, as safetensors writes it


class _Writer:
    """This rank's files: opened at their first tensor, closed (fsync, rename) after their last."""

    def __init__(self, directory, files):
        self.dir, self.error, self.open, self.done = directory, None, {}, []
        self.mine = {name for i, (name, _) in enumerate(files) if i % _comm.world_size() == _comm.rank()}
        self.outs = dict(files)
        self.left = {name: len(outs) for name, outs in files}

    def write(self, out, value):
        if out.file not in self.mine or self.error is not None:
            return
        try:
            f = self.open.get(out.file)
            if f is None:
                path = os.path.join(self.dir, out.file)
                f = self.open[out.file] = open(f"{path}.tmp.{os.getpid()}", "wb")
                header = _header(self.outs[out.file])
                f.write(len(header).to_bytes(8, "little"))
                f.write(header)
                f.data_start = 8 + len(header)
            if f.tell() != f.data_start + out.offset:
                raise RuntimeError(f"'{out.name}' would be written at byte {f.tell()}, not its planned "
                                   f"{f.data_start + out.offset}")
            v = value.detach().to(out.dtype).contiguous()
            if tuple(v.shape) != out.shape:
                raise RuntimeError(f"'{out.name}' has shape {tuple(v.shape)}, planned {out.shape}")
            f.write(memoryview(v.reshape(-1).view(torch.uint8).numpy()))
            self.left[out.file] -= 1
            if self.left[out.file] == 0:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                del self.open[out.file]
                path = os.path.join(self.dir, out.file)
                os.replace(f"{path}.tmp.{os.getpid()}", path)
                self.done.append(out.file)
        except Exception as e:  # noqa: BLE001  (reported on every rank once the gathers are over)
            self.error = f"rank {_comm.rank()}: writing {out.file}: {type(e).__name__}: {e}"
            self.abandon()
            tmp = os.path.join(self.dir, f"{out.file}.tmp.{os.getpid()}")  # closed already, its rename failed
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def abandon(self):
        for name, f in list(self.open.items()):
            f.close()
            tmp = os.path.join(self.dir, f"{name}.tmp.{os.getpid()}")
            if os.path.lexists(tmp):
                os.unlink(tmp)
        self.open.clear()


def _agree(error, what):
    errors = [e for e in _comm.allgather_object(error) if e]
    if errors:
        raise RuntimeError(f"strata: save_pretrained: {what}: " + "; ".join(errors))


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish(engine, directory, files, layout, dtype):
    """Rank 0: the index (or none), the files of an earlier export this one replaces, the configs."""
    names = {name for name, _ in files}
    stem = layout.weights_name.rsplit(".", 1)[0]
    index_name = layout.weights_name + ".index.json"
    if len(files) > 1:
        weight_map = {o.name: name for name, outs in files for o in outs}
        index = {"metadata": {"total_size": sum(o.nbytes for _, outs in files for o in outs)},
                 "weight_map": weight_map}
        path = os.path.join(directory, index_name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    for name in os.listdir(directory):
        stale = (re.fullmatch(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors", name) and name not in names) or \
            (name == layout.weights_name and name not in names) or (name == index_name and len(files) == 1)
        if stale:
            os.unlink(os.path.join(directory, name))
    model = engine.model
    if layout.adapter is not None:
        model.peft_config[layout.adapter].save_pretrained(directory)
    elif _transformers_model(model):
        model.config.dtype = str(dtype or torch.float32).split(".")[1]
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(directory)
        if model.can_generate() and getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(directory)
    _fsync_dir(directory)


def save_pretrained(engine, save_directory, max_shard_size="50GB", trainable_only=False, dtype=None):
    """Engine.save_pretrained: Note [Streaming export]. Collective."""
    why = engine.mid_step()
    if why is not None:
        raise RuntimeError(f"strata: save_pretrained() in the middle of a step ({why}); call it between steps")
    directory = os.fspath(save_directory)
    max_bytes = parse_size(max_shard_size)
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"strata: save_pretrained(dtype={dtype}): float32, bfloat16 or float16")
    layout, groups = _plan(engine, trainable_only, dtype)
    files = _split(groups, max_bytes, layout.weights_name)
    error = None
    try:
        if os.path.isfile(directory):
            raise ValueError(f"'{directory}' is a file, not a directory")
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        error = f"rank {_comm.rank()}: {directory}: {e}"
    except ValueError as e:
        error = f"rank {_comm.rank()}: {e}"
    _agree(error, "the directory")
    writer = _Writer(directory, files)
    buffers = None
    for g in groups:
        values = {}
        flat = engine.gather_unit(g.unit) if g.unit < len(engine.units) else None  # one gather for the unit
        for name, src in g.sources:
            if isinstance(src, tuple):
                ul = engine.units[src[0]].layout
                o, n = ul.offsets[src[1]], ul.numels[src[1]]
                values[name] = flat[o:o + n].view(ul.shapes[src[1]])
            else:
                if buffers is None:  # rank 0's, on every rank (collective, once)
                    buffers = engine.model_buffers.rank0_values()
                values[name] = buffers.get(id(src), src.detach())
        converted = layout.convert(values)
        for out in g.outs:
            writer.write(out, converted[out.name])
        del values, converted, flat
        _deferred._trim()  # the unit's freed blocks back to the OS (Note [Trimmed heap] in _hooks)
    if writer.open and writer.error is None:
        writer.error = f"rank {_comm.rank()}: files left unfinished: {sorted(writer.open)}"
        writer.abandon()
    _agree(writer.error, "writing the files")
    error = None
    if _comm.rank() == 0:
        try:
            _finish(engine, directory, files, layout, dtype)
        except Exception as e:  # noqa: BLE001
            error = f"rank 0: {type(e).__name__}: {e}"
    _agree(error, "the index and configs")
    return [name for name, _ in files]
