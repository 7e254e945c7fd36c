"""engine.load_pretrained(dir): a Hugging Face checkpoint read straight into the shards.

Note [Pretrained into shards]. The directory holds `model.safetensors`, or `model.safetensors.index.json`
and the files its weight_map names (transformers' save_pretrained, and engine.save_pretrained, write
these). The checkpoint is opened, and every file of it validated as untrusted input, by the library
(strata_safetensors_open; Note [Pretrained by byte ranges] in runtime/checkpoint/pretrained.h,
docs/decisions/0009, 0010, 0037): the index, each header (length, JSON without repeated keys, dtypes, shapes
of at most 64 dimensions, data_offsets holding exactly each tensor's bytes, the tensors tiling the data), a
tensor in two files or in a file the index does not name for it; every error names the file and the tensor.
Here the names are matched and the shapes checked; then one strata_engine_load_safetensors call makes each
rank read, for each parameter, only the elements its shards keep (strata_engine_held_range: about
1/world_size of each unit at stage 3, everything at stages 0-2, where the parameters are replicated) by their
byte ranges through the offload layer's reader (io_uring with registered staging buffers, or its pread thread
pool), converted to fp32 (F32, BF16 and F16 parameters; another dtype is refused). Persistent buffers are
read whole by every rank (strata_safetensors_read), in their own dtype. `last_load_stats` keeps the last
load's reader statistics on this rank (bytes read, requests, the back-end, and the bytes the engine's NVMe
offload wrote and read meanwhile), for tests and benchmarks.

Names. A tied parameter is found under any of its names (transformers writes one). The checkpoint's names
are the model's state-dict names, or, for a transformers model whose checkpoint format renames its modules
(ViT in transformers 5), the names its revert_weight_conversion gives. Where the conversion stacks or
concatenates checkpoint tensors into one parameter (Mixtral's experts: one tensor per expert in the file, one
stacked parameter in the model), each tensor fills its run of the parameter's elements (Note [Stacked
parameters] at _stacked_pieces); another conversion that combines tensors is refused, naming them. strict=True (the default) refuses a parameter or
buffer the checkpoint lacks and a tensor the model lacks; strict=False leaves the missing ones as they are
and returns both lists. The ranks agree on every check before any value is written, so they fail together.
docs/decisions/0034-models-created-sharded.md.
"""
import ctypes
import os

import torch

from strata import _capi, _comm
from strata.torch._model_buffers import _DTYPES

SAFE_NAME, INDEX_NAME = "model.safetensors", "model.safetensors.index.json"
_FLOATS = ("F32", "BF16", "F16")
last_load_stats = None  # the last load's reader statistics on this rank (a dict), see the Note


class CheckpointError(ValueError):
    """A checkpoint file or index that is not what it must be; the message names the file and the tensor."""


def _message(error):
    """The library's message of a StrataError, without the function name it starts with."""
    text = str(error).split(": ", 1)[-1]
    return text.split(": ", 1)[1] if text.startswith("strata_") else text


class _Handle:
    """An open strata_safetensors handle, closed once."""

    def __init__(self, path):
        self.ptr = _capi.c_void_p()
        try:
            _capi.check(_capi.lib.strata_safetensors_open(os.fsencode(path), ctypes.byref(self.ptr)))
        except _capi.StrataError as e:
            raise CheckpointError(_message(e)) from None

    def close(self):
        if self.ptr:
            _capi.lib.strata_safetensors_close(self.ptr)
            self.ptr = _capi.c_void_p()


class _Entry:
    __slots__ = ("file", "name", "dtype", "shape", "begin", "end", "index")

    def __init__(self, file, name, dtype, shape, begin, end, index):
        self.file, self.name, self.dtype, self.shape, self.begin, self.end = file, name, dtype, shape, begin, end
        self.index = index


class _File:
    """One safetensors file of an open checkpoint: its path and data size; reads whole tensors' bytes."""

    def __init__(self, handle, path, data_len):
        self.handle, self.path, self.data_len = handle, path, data_len

    def bad(self, why, tensor=None):
        where = f"tensor '{tensor}': " if tensor is not None else ""
        return CheckpointError(f"'{self.path}': {where}{why}")

    def read(self, entry, first, count):
        """Elements [first, first + count) of a tensor, as its dtype (strata_safetensors_read)."""
        if entry.dtype not in _DTYPES:
            raise self.bad(f"is {entry.dtype}, which this reader does not convert to a torch dtype", entry.name)
        dtype = _DTYPES[entry.dtype]
        out = torch.empty(count, dtype=dtype)
        item = out.element_size()
        try:
            _capi.check(_capi.lib.strata_safetensors_read(self.handle.ptr, entry.index, first * item,
                                                          _capi.c_void_p(out.data_ptr()), count * item))
        except _capi.StrataError as e:
            raise CheckpointError(_message(e)) from None
        return out

    def close(self):
        self.handle.close()


def open_checkpoint(directory):
    """{tensor name: _Entry} of a checkpoint directory, and its files (closing one closes the checkpoint)."""
    handle = _Handle(os.fspath(directory))
    try:
        n = _capi.c_size_t()
        _capi.check(_capi.lib.strata_safetensors_num_tensors(handle.ptr, ctypes.byref(n)))
        files, entries = {}, {}
        for i in range(n.value):
            info = _capi.SafetensorsTensor.new()
            _capi.check(_capi.lib.strata_safetensors_tensor_info(handle.ptr, i, ctypes.byref(info)))
            path = os.fsdecode(info.file)
            f = files.setdefault(path, _File(handle, path, info.file_data_bytes))
            name = info.name.decode("utf-8", "surrogateescape")
            entries[name] = _Entry(f, name, info.dtype.decode(), tuple(info.shape[d] for d in range(info.ndim)),
                                   info.data_begin, info.data_end, i)
    except BaseException:
        handle.close()
        raise
    if not files:  # a checkpoint without tensors: a file to close all the same
        files[""] = _File(handle, "", 0)
    return entries, list(files.values())


def _checkpoint_names(model, shapes):
    """{checkpoint name: (model state-dict name, at, shape)} for {name: shape}: the identity, or transformers'
    renaming of a model whose checkpoint format renames its modules (at and shape None: the tensor is the whole
    parameter), or, where the conversion stacks or concatenates checkpoint tensors into one parameter (Mixtral's
    experts), the element `at` which each of them starts and the shape the conversion expects of it (Note [Stacked
    parameters]); another conversion that combines tensors is refused."""
    rename = {n: (n, None, None) for n in shapes}
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
    names = {k: (source[id(t)], None, None) for k, t in out.items() if id(t) in source}
    if combined:
        wanted = {k: tuple(out[k].shape) for k in combined}
        pieces = _stacked_pieces(model, shapes, wanted, revert_weight_conversion)
        if pieces is None:
            raise NotImplementedError(f"strata: load_pretrained: transformers converts this model's checkpoint "
                                      f"tensors into its parameters by combining them ({combined[:3]}) in a way a "
                                      f"per-shard read cannot follow (only stacking and concatenating whole rows "
                                      f"is); load it with from_pretrained and st.shard(model)")
        names.update({k: (n, at, wanted[k]) for k, (n, at) in pieces.items()})
    return names


def _stacked_pieces(model, shapes, wanted, revert):
    """Note [Stacked parameters]. {checkpoint name: (parameter name, at)} for the checkpoint tensors `wanted`
    ({name: shape}) that the conversion builds from parameters' rows, or None if any is not a run of whole rows
    of one parameter.

    The conversion is run on row numbers: each parameter of shape S is given as an int64 tensor of shape
    S[:-1] + (1,) whose values number its rows (consecutively across parameters), so the conversion's stacking,
    splitting and concatenating along any dimension but the last moves the numbers as it would move the rows
    (a few bytes per row, never the model). A checkpoint tensor whose numbers are consecutive rows of one
    parameter, with that parameter's row length, is the elements [first row x row length, ...) of it."""
    rows, first, numbered = {}, 0, {}
    for n, shape in shapes.items():
        length, count = (shape[-1] if shape else 1), _numel(shape[:-1])
        rows[n] = (first, count, length)
        numbered[n] = torch.arange(first, first + count, dtype=torch.int64).view(*shape[:-1], 1) if shape else \
            torch.tensor(first, dtype=torch.int64)
        first += count
    try:
        out = revert(model, numbered)
    except Exception:  # noqa: BLE001  (an operation that is not a move of rows: refused by the caller)
        return None
    pieces = {}
    for k, shape in wanted.items():
        t = out.get(k)
        if t is None or not shape or tuple(t.shape) != tuple(shape[:-1]) + (1,) or t.numel() == 0:
            return None
        v = t.reshape(-1)
        start = int(v[0])
        if not torch.equal(v, torch.arange(start, start + v.numel(), dtype=v.dtype)):
            return None
        owner = next((n for n, (f, c, _) in rows.items() if f <= start and start + v.numel() <= f + c), None)
        if owner is None or rows[owner][2] != shape[-1]:
            return None
        pieces[k] = (owner, (start - rows[owner][0]) * rows[owner][2])
    return pieces


def _agree(error):
    errors = [e for e in _comm.allgather_object(error) if e]
    if errors:
        raise CheckpointError("strata: load_pretrained: " + "; ".join(dict.fromkeys(errors)))


def supplied(engine, directory, strict=True):
    """The ids of the parameters a load_pretrained(engine, directory, strict) would write (collective: the
    ranks check the checkpoint together, and its errors are raised here as load_pretrained raises them), for
    st.shard(factory, config, pretrained=DIR), which then replays only the rest (_created.Created.load)."""
    plan, files, _, _ = _plan(engine, directory, strict)
    for f in files:
        f.close()
    return frozenset(id(t) for t, src, _, _ in plan if src is not None)


def load_pretrained(engine, directory, strict=True):
    """Engine.load_pretrained: Note [Pretrained into shards]. Collective."""
    from strata.torch._gathered import refuse_while_gathered  # noqa: PLC0415
    why = engine.mid_step()
    if why is not None:
        raise RuntimeError(f"strata: load_pretrained() in the middle of a step ({why}); call it between steps")
    refuse_while_gathered(engine, "load_pretrained()")
    plan, files, missing, unexpected = _plan(engine, directory, strict)
    try:
        error = None
        try:
            for t, src, e, _ in plan:
                if src is None:  # a buffer: whole, every rank
                    with torch.no_grad():
                        t.copy_(e.file.read(e, 0, t.numel()).view(t.shape).to(t.dtype))
            _load_held(engine, [(src, e, at) for _, src, e, at in plan if src is not None], files)
        except CheckpointError as e:
            error = f"rank {_comm.rank()}: {e}"
        except _capi.StrataError as e:
            error = f"rank {_comm.rank()}: {_message(e)}"
        _agree(error)
    finally:
        for f in files:
            f.close()
    return {"missing_keys": missing, "unexpected_keys": unexpected}


def _plan(engine, directory, strict):
    """The checkpoint opened and matched to the model, every rank agreeing (collective): [(tensor, (unit, index)
    or None for a buffer, _Entry, at)], the open files (the caller closes them), missing and unexpected names."""
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
        found, stacked = {}, {}  # model name -> its entry; or -> [(at, entry)] of a stacked parameter
        for k, e in entries.items():
            if k in names:
                n, at, piece = names[k]
                if at is None:
                    found[n] = e
                else:  # the elements are placed by `at` and counted by _tiled; the shape is checked here
                    if e.shape != piece:
                        raise e.file.bad(f"has shape {list(e.shape)}; as a piece of the model's '{n}' it is "
                                         f"{list(piece)}", e.name)
                    stacked.setdefault(n, []).append((at, e))
        unexpected = sorted(k for k in entries if k not in names)
        for t, tnames in wanted.values():
            shape = shapes.get(id(t), tuple(t.shape))
            e = next((found[n] for n in tnames if n in found), None)
            if e is None and id(t) in where and any(n in stacked for n in tnames):
                plan.extend((t, where[id(t)], e, at) for at, e in _tiled(stacked[next(n for n in tnames
                                                                                  if n in stacked)], tnames[0], shape))
                continue
            if e is None:
                missing.extend(tnames)
                continue
            if e.shape != shape:
                raise e.file.bad(f"has shape {list(e.shape)}; the model's '{tnames[0]}' is {list(shape)}", e.name)
            if id(t) in where and e.dtype not in _FLOATS:
                raise e.file.bad(f"is {e.dtype}; a parameter is read from {', '.join(_FLOATS)}", e.name)
            plan.append((t, where.get(id(t)), e, None))
        if strict and (missing or unexpected):
            raise CheckpointError(f"'{directory}' is not this model's checkpoint: " + "; ".join(
                part for part in (f"missing {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else "")
                                  if missing else "",
                                  f"unexpected {', '.join(unexpected[:8])}" + (" ..." if len(unexpected) > 8 else "")
                                  if unexpected else "") if part) +
                " (strict=False, or st.shard's pretrained_strict=False, loads what matches)")
    except (CheckpointError, NotImplementedError) as e:
        error = f"rank {_comm.rank()}: {e}"
    except OSError as e:
        error = f"rank {_comm.rank()}: {directory}: {e}"
    try:
        _agree(error)  # every rank checked the same files: all go on, or all stop
    except BaseException:
        for f in files:
            f.close()
        raise
    return plan, files, missing, unexpected


def _tiled(pieces, name, shape):
    """[(at, entry)] of a stacked parameter, checked to tile it exactly (each a float tensor, in order)."""
    numel, end = _numel(shape), 0
    for at, e in sorted(pieces, key=lambda p: p[0]):
        if at != end:
            raise e.file.bad(f"starts at element {at} of the model's '{name}', but the checkpoint's tensors for it "
                             f"cover [0, {end}) before it", e.name)
        if e.dtype not in _FLOATS:
            raise e.file.bad(f"is {e.dtype}; a parameter is read from {', '.join(_FLOATS)}", e.name)
        end += _numel(e.shape)
    if end != numel:
        raise CheckpointError(f"the checkpoint's tensors for the model's '{name}' ({len(pieces)} of them) hold {end} "
                              f"elements; it has {numel}")
    return sorted(pieces, key=lambda p: p[0])


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _load_held(engine, targets, files):
    """The elements of each parameter this rank keeps, read by their byte ranges and written into the engine by
    the library (strata_engine_load_safetensors, or _at where a parameter is stacked from several tensors);
    targets are ((unit, param index), _Entry, at or None)."""
    global last_load_stats
    n = len(targets)
    units = (_capi.c_int32 * n)(*[u for (u, _), _, _ in targets])
    params = (_capi.c_int32 * n)(*[i for (_, i), _, _ in targets])
    tensors = (_capi.c_uint64 * n)(*[e.index for _, e, _ in targets])
    stats = _capi.LoadStats.new()
    handle = files[0].handle if files else None
    ptr = handle.ptr if handle else None
    if any(at is not None for _, _, at in targets):
        at = (_capi.c_uint64 * n)(*[a or 0 for _, _, a in targets])
        _capi.check(_capi.lib.strata_engine_load_safetensors_at(engine.handle, ptr, units, params, tensors, at, n,
                                                                None, ctypes.byref(stats)))
    else:
        _capi.check(_capi.lib.strata_engine_load_safetensors(engine.handle, ptr, units, params, tensors, n, None,
                                                             ctypes.byref(stats)))
    last_load_stats = {"bytes_read": stats.bytes_read, "requests": stats.requests,
                       "fixed_buffer_ios": stats.fixed_buffer_ios, "elements": stats.elements,
                       "seconds": stats.seconds, "backend": stats.backend.decode(),
                       "nvme_bytes_written": stats.nvme_bytes_written, "nvme_bytes_read": stats.nvme_bytes_read}
