"""engine.load_pretrained(dir): a Hugging Face checkpoint read straight into the shards.

Note [Pretrained into shards]. The directory holds `model.safetensors`, or `model.safetensors.index.json`
and the files its weight_map names (transformers' save_pretrained, and engine.save_pretrained, write
these). Every file is untrusted input (docs/decisions/0009, 0010): the index must be a JSON object whose
weight_map maps names to plain file names in the directory; each file's header length must fit the file and
100 MB, its header must be a JSON object without repeated keys, each tensor a dtype this reader knows, a shape
of at most 64 non-negative dimensions and data_offsets [begin, end] holding exactly its bytes within the data,
the tensors tiling the data without overlaps or holes (the safetensors format's rule); every error names the
file and the tensor. Then each rank reads, for each parameter, only the elements its shards keep
(strata_engine_held_range: about 1/world_size of each unit at stage 3, everything at stages 0-2, where the
parameters are replicated) with os.pread at their byte offsets, converts them to fp32 (F32, BF16, F16 and F64
are read) and writes them with strata_engine_set_param_range. Persistent buffers are read whole by every
rank. A first version: plain pread, not the offload layer's io_uring reader with registered buffers.

Names. A tied parameter is found under any of its names (transformers writes one). The checkpoint's names
are the model's state-dict names, or, for a transformers model whose checkpoint format renames its modules
(ViT in transformers 5), the names its revert_weight_conversion gives; a conversion that combines tensors
(Mixtral's fused experts) is refused, naming the tensors. strict=True (the default) refuses a parameter or
buffer the checkpoint lacks and a tensor the model lacks; strict=False leaves the missing ones as they are
and returns both lists. The ranks agree on every check before any value is written, so they fail together.
docs/decisions/0034-models-created-sharded.md.
"""
import ctypes
import json
import os
import stat

import torch

from strata import _capi, _comm
from strata.torch._model_buffers import _DTYPES, MAX_HEADER_BYTES, MAX_NDIM, _is_int, _no_duplicates

SAFE_NAME, INDEX_NAME = "model.safetensors", "model.safetensors.index.json"
_FLOATS = ("F64", "F32", "BF16", "F16")


class CheckpointError(ValueError):
    """A checkpoint file or index that is not what it must be; the message names the file and the tensor."""


class _Entry:
    __slots__ = ("file", "name", "dtype", "shape", "begin", "end")

    def __init__(self, file, name, dtype, shape, begin, end):
        self.file, self.name, self.dtype, self.shape, self.begin, self.end = file, name, dtype, shape, begin, end


class _File:
    """One safetensors file: its header read and validated; its data read by byte ranges."""

    def __init__(self, path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise CheckpointError(f"'{path}': {e.strerror}") from None
        try:
            self._read_header()
        except BaseException:
            os.close(self.fd)
            raise

    def bad(self, why, tensor=None):
        where = f"tensor '{tensor}': " if tensor is not None else ""
        return CheckpointError(f"'{self.path}': {where}{why}")

    def _read_header(self):
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            raise self.bad("not a regular file")
        size = st.st_size
        if size < 8:
            raise self.bad(f"{size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(os.pread(self.fd, 8, 0), "little")
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise self.bad(f"header length {n} exceeds the file ({size} bytes) or {MAX_HEADER_BYTES} bytes")
        raw = os.pread(self.fd, n, 8)
        if len(raw) != n:
            raise self.bad("the file ended inside its header")
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self.bad(f"the header is not a JSON document ({e})") from None
        if not isinstance(header, dict):
            raise self.bad("the header is not a JSON object")
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise self.bad("__metadata__ is not an object of strings")
        self.data_start, self.data_len = 8 + n, size - 8 - n
        self.entries = {}
        spans = []
        for name, e in header.items():
            if (not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}
                    or not isinstance(e["dtype"], str) or e["dtype"] not in _DTYPES or not isinstance(e["shape"], list)
                    or len(e["shape"]) > MAX_NDIM or not all(_is_int(d) and d >= 0 for d in e["shape"])
                    or not isinstance(e["data_offsets"], list) or len(e["data_offsets"]) != 2
                    or not all(_is_int(o) for o in e["data_offsets"])):
                raise self.bad(f"expected {{\"dtype\": one of {sorted(_DTYPES)}, \"shape\": up to {MAX_NDIM} "
                               f"non-negative integers, \"data_offsets\": [begin, end]}}, found {e!r:.200}", name)
            dtype, shape = _DTYPES[e["dtype"]], tuple(e["shape"])
            begin, end = e["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            if not 0 <= begin <= end <= self.data_len or end - begin != numel * dtype.itemsize:
                raise self.bad(f"data_offsets [{begin}, {end}] do not hold {numel} {e['dtype']} elements within "
                               f"the {self.data_len} data bytes", name)
            self.entries[name] = _Entry(self, name, e["dtype"], shape, begin, end)
            spans.append((begin, end, name))
        spans.sort()
        at = 0
        for begin, end, name in spans:
            if begin != at:
                raise self.bad(f"starts at data byte {begin}, expected {at} (the tensors must tile the data without "
                               f"gaps or overlaps)", name)
            at = end
        if at != self.data_len:
            raise self.bad(f"the tensors hold {at} data bytes and the file has {self.data_len}")

    def read(self, entry, first, count):
        """Elements [first, first + count) of a tensor, as its dtype, from their byte range."""
        item = _DTYPES[entry.dtype].itemsize
        offset, want = self.data_start + entry.begin + first * item, count * item
        buf = bytearray(want)
        view, got = memoryview(buf), 0
        while got < want:
            chunk = os.preadv(self.fd, [view[got:]], offset + got)
            if chunk <= 0:
                raise self.bad(f"the file ended at byte {offset + got} (truncated since its header was read)",
                               entry.name)
            got += chunk
        return torch.frombuffer(buf, dtype=_DTYPES[entry.dtype]) if want else torch.empty(0, dtype=_DTYPES[entry.dtype])

    def close(self):
        os.close(self.fd)


def _plain_name(directory, name, what):
    if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
        raise CheckpointError(f"'{os.path.join(directory, INDEX_NAME)}': {what} names the file {name!r}, which is "
                              f"not a plain file name in the directory")
    return name


def open_checkpoint(directory):
    """{tensor name: _Entry} of a checkpoint directory, and its open files."""
    directory = os.fspath(directory)
    index_path = os.path.join(directory, INDEX_NAME)
    if os.path.exists(os.path.join(directory, SAFE_NAME)):
        weight_map = None
        names = [SAFE_NAME]
    elif os.path.exists(index_path):
        try:
            with open(index_path, "rb") as f:
                raw = f.read(MAX_HEADER_BYTES + 1)
            if len(raw) > MAX_HEADER_BYTES:
                raise ValueError(f"larger than {MAX_HEADER_BYTES} bytes")
            index = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise CheckpointError(f"'{index_path}': not a readable JSON index ({e})") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"'{index_path}': no \"weight_map\" object of tensor names to files")
        for tensor, file in weight_map.items():
            _plain_name(directory, file, f"tensor '{tensor}'")
        names = sorted(set(weight_map.values()))
    else:
        raise CheckpointError(f"'{directory}': neither {SAFE_NAME} nor {INDEX_NAME} (a Hugging Face checkpoint "
                              f"directory, as save_pretrained writes it)")
    files, entries = [], {}
    try:
        for name in names:
            f = _File(os.path.join(directory, name))
            files.append(f)
            for tensor, e in f.entries.items():
                if tensor in entries:
                    raise f.bad(f"also in '{entries[tensor].file.path}'", tensor)
                if weight_map is not None and weight_map.get(tensor) != name:
                    raise f.bad(f"the index names {weight_map.get(tensor)!r} for it", tensor)
                entries[tensor] = e
        if weight_map is not None:
            missing = [t for t in weight_map if t not in entries]
            if missing:
                raise CheckpointError(f"'{index_path}': tensor '{missing[0]}' is not in '{weight_map[missing[0]]}'"
                                      + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else ""))
    except BaseException:
        for f in files:
            f.close()
        raise
    return entries, files


def _checkpoint_names(model, shapes):
    """{checkpoint name: model state-dict name} for {name: shape}: the identity, or transformers' renaming of a
    model whose checkpoint format renames its modules; a conversion that combines tensors is refused."""
    rename = {n: n for n in shapes}
    try:
        from transformers import PreTrainedModel  # noqa: PLC0415
        from transformers.core_model_loading import revert_weight_conversion  # noqa: PLC0415
    except ImportError:
        return rename
    if not isinstance(model, PreTrainedModel):
        return rename
    meta = {n: torch.empty(shape, device="meta") for n, shape in shapes.items()}
    source = {id(t): n for n, t in meta.items()}
    out = revert_weight_conversion(model, dict(meta))
    combined = [k for k, t in out.items() if id(t) not in source]
    if combined:
        raise NotImplementedError(f"strata: load_pretrained: transformers converts this model's checkpoint "
                                  f"tensors into its parameters by combining them ({combined[:3]}), which a "
                                  f"per-shard read cannot do yet; load it with from_pretrained and st.shard(model)")
    return {k: source[id(t)] for k, t in out.items()}


def _agree(error):
    errors = [e for e in _comm.allgather_object(error) if e]
    if errors:
        raise CheckpointError("strata: load_pretrained: " + "; ".join(dict.fromkeys(errors)))


def load_pretrained(engine, directory, strict=True):
    """Engine.load_pretrained: Note [Pretrained into shards]. Collective."""
    from strata.torch._gathered import refuse_while_gathered  # noqa: PLC0415
    why = engine.mid_step()
    if why is not None:
        raise RuntimeError(f"strata: load_pretrained() in the middle of a step ({why}); call it between steps")
    refuse_while_gathered(engine, "load_pretrained()")
    model = engine.model
    where = {id(p): (u.id, i) for u in engine.units for i, p in enumerate(u.spec.params)}
    shapes = {id(p): tuple(u.layout.shapes[i]) for u in engine.units for i, p in enumerate(u.spec.params)}
    state = model.state_dict(keep_vars=True)  # the Parameters themselves: nothing gathered
    wanted = {}  # id(tensor) -> (tensor, its names)
    for name, t in state.items():
        if isinstance(t, torch.Tensor):
            wanted.setdefault(id(t), (t, []))[1].append(name)
    error, plan, files, missing, unexpected = None, [], [], [], []
    try:
        entries, files = open_checkpoint(directory)
        names = _checkpoint_names(model, {n: shapes.get(id(t), tuple(t.shape)) for n, t in state.items()
                                          if isinstance(t, torch.Tensor)})
        found = {names[k]: e for k, e in entries.items() if k in names}
        unexpected = sorted(k for k in entries if k not in names)
        for t, tnames in wanted.values():
            e = next((found[n] for n in tnames if n in found), None)
            if e is None:
                missing.extend(tnames)
                continue
            shape = shapes.get(id(t), tuple(t.shape))
            if e.shape != shape:
                raise e.file.bad(f"has shape {list(e.shape)}; the model's '{tnames[0]}' is {list(shape)}", e.name)
            if id(t) in where and e.dtype not in _FLOATS:
                raise e.file.bad(f"is {e.dtype}; a parameter is read from {', '.join(_FLOATS)}", e.name)
            plan.append((t, where.get(id(t)), e))
        if strict and (missing or unexpected):
            raise CheckpointError(f"'{directory}' is not this model's checkpoint: " + "; ".join(
                part for part in (f"missing {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else "")
                                  if missing else "",
                                  f"unexpected {', '.join(unexpected[:8])}" + (" ..." if len(unexpected) > 8 else "")
                                  if unexpected else "") if part) + " (strict=False loads what matches)")
    except (CheckpointError, NotImplementedError) as e:
        error = f"rank {_comm.rank()}: {e}"
    except OSError as e:
        error = f"rank {_comm.rank()}: {directory}: {e}"
    try:
        _agree(error)  # every rank checked the same files: all go on, or all stop
        error = None
        try:
            for t, src, e in plan:
                if src is None:  # a buffer: whole, every rank
                    with torch.no_grad():
                        t.copy_(e.file.read(e, 0, t.numel()).view(t.shape).to(t.dtype))
                    continue
                _set_held(engine, src, e)
        except (CheckpointError, _capi.StrataError) as e:
            error = f"rank {_comm.rank()}: {e}"
        _agree(error)
    finally:
        for f in files:
            f.close()
    return {"missing_keys": missing, "unexpected_keys": unexpected}


def _set_held(engine, src, e):
    """The elements of one parameter this rank keeps, read by their byte range and written into the engine."""
    unit, index = src
    u = engine.units[unit]
    begin, end = _capi.c_uint64(), _capi.c_uint64()
    _capi.check(_capi.lib.strata_engine_held_range(engine.handle, unit, ctypes.byref(begin), ctypes.byref(end)))
    offset, numel = u.layout.offsets[index], u.layout.numels[index]
    first, last = max(begin.value, offset) - offset, min(end.value, offset + numel) - offset
    if last <= first:
        return
    values = e.file.read(e, first, last - first).to(torch.float32).contiguous()
    _capi.check(_capi.lib.strata_engine_set_param_range(engine.handle, unit, index, first,
                                                        _capi.c_void_p(values.data_ptr()), values.numel()))
