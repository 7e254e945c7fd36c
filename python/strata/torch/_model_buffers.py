"""Module buffers (BatchNorm's running statistics and counters, masks, rotary tables): part of the model.

The engine owns the parameters; buffers stay ordinary torch tensors of the model, so strata.torch keeps
them the way DDP does and checkpoints them beside the engine's state (docs/decisions/0026-buffers.md):

- shard(): every buffer (persistent or not) gets rank 0's value, as the parameters' initial values do;
  with bf16 parameters the floating buffers are cast to bf16 too (where model.to(torch.bfloat16) would
  cast them; integer and bool buffers are untouched), so a BatchNorm computes in one dtype; those that
  transformers keeps in fp32 keep their dtype (Note [Modules kept in fp32] in _fp32_modules).
- strata.broadcast_buffers (default true; DDP's broadcast_buffers=True): rank 0's buffers are broadcast
  at the start of every training forward and again at the end of every step(), so the ranks' running
  statistics never drift apart and an evaluation after a step sees the same buffers on every rank
  (Note [Buffer sync points]). false: each rank keeps its own (DDP's forward_sync_buffers=False).
- Checkpoints: rank 0 writes its persistent buffers (model.state_dict()'s) to FILE_NAME in the step
  directory before the engine publishes the manifest (Note [Buffers file]); load_checkpoint restores them
  bit for bit on every rank.
- full_state_dict(): rank 0's buffers on every rank.
Every broadcast is one collective: all buffers packed as bytes into one flat uint8 tensor.
"""
import hashlib
import json
import os
import re
import stat
import struct
import sys
import warnings

import torch

from strata import _comm
from strata._capi import StrataError
from strata._log import who

FILE_NAME = "torch_buffers.safetensors"
MANIFEST_NAME = "manifest.json"  # runtime/checkpoint/manifest.h kManifestName
FORMAT, VERSION = "strata-torch-buffers", "1"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a header
MAX_NDIM = 64

# safetensors' dtype names (little-endian data)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


def take_option(config):
    """strata.broadcast_buffers (a front-end key, removed from the config the engine parses): a JSON bool,
    default true."""
    strata = config.get("strata")
    if not isinstance(strata, dict) or "broadcast_buffers" not in strata:
        return True
    value = strata.pop("broadcast_buffers")
    if not isinstance(value, bool):
        raise ValueError(f"strata: config key 'strata.broadcast_buffers' must be true or false, not {value!r}")
    return value


def broadcast_into(tensors):
    """Rank 0's values of `tensors` (distinct tensors, any dtypes and devices) into every rank's, in place:
    one broadcast of their bytes packed into one flat uint8 tensor (collective)."""
    if not tensors or _comm.world_size() == 1:
        return
    sizes = [t.numel() * t.element_size() for t in tensors]
    if _comm.rank() == 0:
        flat = torch.cat([t.detach().reshape(-1).view(torch.uint8).cpu() for t in tensors])
    else:
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
    _comm.broadcast_from_0(flat)
    if _comm.rank() == 0:
        return
    offset = 0
    with torch.no_grad():
        for t, n in zip(tensors, sizes):
            if n:
                t.copy_(flat[offset:offset + n].view(t.dtype).view(t.shape))
            offset += n


def _unique(tensors):
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class ModelBuffers:
    """The model's buffers as strata.torch keeps them (the module docstring)."""

    def __init__(self, model, compute_dtype, broadcast, kept=frozenset()):
        self.model, self.broadcast = model, broadcast
        self.kept = kept  # ids of the buffers kept in their dtype (Note [Modules kept in fp32] in _fp32_modules)
        # (module, key, name) of every buffer registered at shard(); a buffer the model reassigns later is
        # read from its slot each time
        self.slots = [(m, k, f"{p}.{k}" if p else k) for p, m in model.named_modules()
                      for k, b in m._buffers.items() if b is not None]
        # model.state_dict()'s buffers (persistent ones, under every path of their module)
        self.persistent = [(m, k, f"{p}.{k}" if p else k) for p, m in model.named_modules(remove_duplicate=False)
                           for k, b in m._buffers.items()
                           if b is not None and k not in m._non_persistent_buffers_set]
        if compute_dtype != torch.float32:
            self._cast(compute_dtype)
        self.specs = [(n, tuple(m._buffers[k].shape), m._buffers[k].dtype) for m, k, n in self.slots]
        self.sync()

    def _cast(self, dtype):
        """As model.to(dtype) casts buffers: the floating ones, but those transformers keeps in fp32 (self.kept);
        a buffer two modules share stays shared."""
        new = {}
        for m, k, _ in self.slots:
            b = m._buffers[k]
            if b.is_floating_point() and b.dtype != dtype and id(b) not in self.kept:
                m._buffers[k] = new.setdefault(id(b), b.to(dtype))

    def _current(self, slots):
        """The buffers now in `slots`, each checked against the shape and dtype it had at shard() (every
        rank must pack the same bytes)."""
        spec = {n: (s, d) for n, s, d in self.specs}
        out = []
        for m, k, n in slots:
            b = m._buffers.get(k)
            if b is None or (tuple(b.shape), b.dtype) != spec[n]:
                now = "removed" if b is None else f"{tuple(b.shape)} {b.dtype}"
                raise RuntimeError(f"strata: buffer '{n}' was {spec[n][0]} {spec[n][1]} at shard() and is now "
                                   f"{now}; the buffers' shapes and dtypes are fixed once the model is sharded")
            out.append(b)
        return out

    # ---- keeping the ranks' buffers equal ----
    def sync(self):
        """Every rank's buffers become rank 0's (collective)."""
        broadcast_into(_unique(self._current(self.slots)))

    def before_training_forward(self):
        # Note [Buffer sync points]. DDP (broadcast_buffers=True) broadcasts rank 0's buffers before each
        # training forward, and before the first forward after one, whatever its kind; an evaluation
        # forward here is not collective at stages 0-2 (rank 0 alone may evaluate), so that second sync
        # point is the end of step() instead, which every rank reaches. Between steps the ranks' buffers
        # are then rank 0's; between a backward and step() (or after a forward with grad disabled in train
        # mode) each rank holds its own forward's update until the next sync.
        if self.broadcast:
            self.sync()

    def after_step(self):
        if self.broadcast:
            self.sync()

    def rank0_values(self):
        """{id(buffer): a copy holding rank 0's value} of model.state_dict()'s buffers (collective)."""
        tensors = _unique(self._current(self.persistent))
        copies = [t.detach().clone() for t in tensors]
        broadcast_into(copies)
        return {id(t): c for t, c in zip(tensors, copies)}

    # ---- checkpoints: Note [Buffers file] ----
    def save(self, step_dir):
        """Collective: rank 0 writes its persistent buffers into `step_dir` (before the engine's save, which
        publishes the manifest last). Raises on every rank if rank 0 could not."""
        error = None
        if _comm.rank() == 0:
            try:
                if not os.path.exists(os.path.join(step_dir, MANIFEST_NAME)):  # else the engine refuses it
                    write_file(step_dir, [(n, b) for (_, _, n), b in
                                          zip(self.persistent, self._current(self.persistent))])
            except Exception as e:  # noqa: BLE001 (every rank must learn of it, whatever it is)
                error = f"{type(e).__name__}: {e}"
        error = _comm.broadcast_object(error)
        if error is not None:
            # The engine's code for a file it could not write, so one `except StrataError` catches every save failure.
            raise StrataError("STRATA_ERR_IO", f"checkpoint '{step_dir}' was not published: rank 0 could not write "
                              f"the model's buffers ({error})")

    def read_checkpoint(self, path):
        """Collective, before the engine loads: rank 0 resolves `path` as the engine does (a step directory,
        or a root's latest complete one) and reads and validates its buffers. Returns (the step directory
        every rank then loads, or the path as given when there is none; what install() takes). Raises the
        same error on every rank for a buffers file that does not fit the model, before anything changes."""
        path = os.fspath(path)
        verdict, values = None, None
        if _comm.rank() == 0:
            step_dir = resolve_checkpoint(path)
            verdict = (step_dir or path, "none", None)
            if step_dir is not None:
                file = os.path.join(step_dir, FILE_NAME)
                if not os.path.lexists(file):
                    verdict = (step_dir, "absent", None)
                else:
                    try:
                        expected = {n: (tuple(b.shape), b.dtype) for (_, _, n), b in
                                    zip(self.persistent, self._current(self.persistent))}
                        values = read_file(file, expected)
                        verdict = (step_dir, "ok", None)
                    except Exception as e:  # noqa: BLE001 (every rank must learn of it, whatever it is)
                        why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                        verdict = (step_dir, "error", why if why.startswith("strata:") else
                                   f"strata: checkpoint buffers '{file}': {why}")
        step_dir, status, message = _comm.broadcast_object(verdict)
        if status == "error":
            raise ValueError(message)
        return step_dir, (step_dir, status, values)

    def install(self, pending):
        """Collective, after the engine loaded: the checkpoint's buffers (rank 0's read) on every rank; a
        checkpoint without them leaves rank 0's current buffers, on every rank, with a warning."""
        step_dir, status, values = pending
        if status == "absent" and self.persistent:
            warnings.warn(f"{who()}: checkpoint '{step_dir}' holds no module buffers (no {FILE_NAME}: saved by "
                          f"strata.torch before it saved buffers, or by `strata train`); the model's "
                          f"{len(self.persistent)} buffers (BatchNorm running statistics, counters) keep their "
                          f"current values, rank 0's on every rank", RuntimeWarning, stacklevel=3)
        if values is not None:
            with torch.no_grad():
                for (m, k, n), b in zip(self.persistent, self._current(self.persistent)):
                    b.copy_(values[n])
        self.sync()


# Note [Buffers file]. FILE_NAME is a safetensors file (any safetensors reader opens it) whose
# __metadata__ names its format and version and holds the SHA-256 of its data. Crash safety is the
# engine's: a step directory is complete once its manifest.json exists (runtime/checkpoint/step_dirs.h),
# and the engine writes the manifest last, after every shard is durable. Rank 0 writes the buffers
# before calling the engine's save (temporary name, fsync, rename, fsync of the directory), and every
# rank learns whether it could before anyone calls it: so a complete step directory always holds its
# buffers, and a save that dies at any point leaves a step the loader does not pick. A step directory is
# removed manifest first (RemoveStep), so its buffers go with it. Loading treats the file as untrusted
# input (docs/decisions/0009, 0010): its size, header, offsets and checksum are checked before its data
# is used, and its names, shapes and dtypes must be the model's.

def resolve_checkpoint(path):
    """The step directory strata_engine_load_checkpoint loads for `path` (checkpoint::ResolveCheckpoint):
    the path itself when it holds a manifest, else the complete step directory with the highest step
    under it; None when there is none (the engine then names the error)."""
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return path
    try:
        names = os.listdir(path)
    except OSError:
        return None
    best = None
    for name in names:
        m = re.fullmatch(r"step_([0-9]+)", name)
        if m is None or int(m.group(1)) >= 2 ** 63:
            continue
        full = os.path.join(path, name)
        if os.path.isdir(full) and os.path.isfile(os.path.join(full, MANIFEST_NAME)):
            if best is None or int(m.group(1)) > best[0]:
                best = (int(m.group(1)), full)
    return None if best is None else best[1]


def _little_endian():
    if sys.byteorder != "little":
        raise ValueError("strata: checkpointed buffers are little-endian; this host is not")


def write_file(step_dir, named):
    """`named` [(name, tensor)] as FILE_NAME in `step_dir`, atomically."""
    _little_endian()
    header, chunks, offset = {}, [], 0
    for name, t in named:
        if t.dtype not in _NAMES:
            raise ValueError(f"buffer '{name}' is {t.dtype}, which a checkpoint cannot hold "
                             f"(supported: {', '.join(str(d) for d in _DTYPES.values())})")
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    data = b"".join(chunks)
    header = {"__metadata__": {"format": FORMAT, "version": VERSION, "sha256": hashlib.sha256(data).hexdigest()},
              **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(step_dir, exist_ok=True)
    path = os.path.join(step_dir, FILE_NAME)
    for stale in os.listdir(step_dir):  # an earlier save's, that died before its rename (this rank's file)
        if stale.startswith(FILE_NAME + ".tmp."):
            os.unlink(os.path.join(step_dir, stale))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key '{k}' appears twice")
        out[k] = v
    return out


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def read_file(path, expected):
    """The tensors of the buffers file at `path`, validated against `expected` {name: (shape, dtype)}:
    the same names, the same shapes, and each dtype the model's, or both floating (then cast to the
    model's, as load_state_dict would: a checkpoint saved with fp32 buffers resumed with bf16 ones).
    ValueError naming the file and what is wrong."""
    _little_endian()

    def bad(why):
        return ValueError(f"strata: checkpoint buffers '{path}': {why}")

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise bad("not a regular file")
        size = st.st_size
        if size < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise bad(f"header length {n} exceeds the file ({size} bytes) or {MAX_HEADER_BYTES} bytes")
        raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise bad(f"the header is not a JSON document ({e})") from None
        if not isinstance(header, dict):
            raise bad("the header is not a JSON object")
        meta = header.pop("__metadata__", None)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise bad(f"not a {FORMAT} file (its __metadata__ has no \"format\": \"{FORMAT}\")")
        if meta.get("version") != VERSION:
            raise bad(f"version {meta.get('version')!r}; this strata.torch reads version {VERSION}")
        digest = meta.get("sha256")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise bad("its __metadata__ has no sha256 of the data")
        data_len = size - 8 - n
        entries = []
        for name, e in header.items():
            if (not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}
                    or e["dtype"] not in _DTYPES or not isinstance(e["shape"], list)
                    or len(e["shape"]) > MAX_NDIM or not all(_is_int(d) and d >= 0 for d in e["shape"])
                    or not isinstance(e["data_offsets"], list) or len(e["data_offsets"]) != 2
                    or not all(_is_int(o) for o in e["data_offsets"])):
                raise bad(f"tensor '{name}': expected {{\"dtype\": one of {sorted(_DTYPES)}, \"shape\": up to "
                          f"{MAX_NDIM} non-negative integers, \"data_offsets\": [begin, end]}}, found {e!r:.200}")
            dtype, shape = _DTYPES[e["dtype"]], tuple(e["shape"])
            begin, end = e["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            if not 0 <= begin <= end <= data_len or end - begin != numel * dtype.itemsize:
                raise bad(f"tensor '{name}': data_offsets [{begin}, {end}] do not hold {numel} {e['dtype']} "
                          f"elements within the {data_len} data bytes")
            entries.append((begin, end, name, dtype, shape))
        entries.sort()
        at = 0
        for begin, end, name, _, _ in entries:
            if begin != at:
                raise bad(f"tensor '{name}' starts at data byte {begin}, expected {at} (the tensors must tile "
                          f"the data without gaps or overlaps)")
            at = end
        if at != data_len:
            raise bad(f"the tensors hold {at} data bytes and the file has {data_len}")
        found = {name: (shape, dtype) for _, _, name, dtype, shape in entries}
        missing = [k for k in expected if k not in found]
        extra = [k for k in found if k not in expected]
        if missing or extra:
            raise bad("its buffers are not the model's: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unexpected {', '.join(extra)}" if extra else "") if part))
        for name, (shape, dtype) in expected.items():
            fshape, fdtype = found[name]
            if fshape != shape:
                raise bad(f"buffer '{name}' has shape {list(fshape)}; the model's is {list(shape)}")
            if fdtype != dtype and not (fdtype.is_floating_point and dtype.is_floating_point):
                raise bad(f"buffer '{name}' is {fdtype}; the model's is {dtype}")
        data = bytearray(data_len)
        if f.readinto(data) != data_len:
            raise bad("the file ended early")
    if hashlib.sha256(data).hexdigest() != digest:
        raise bad("the data does not match its sha256 (corrupt or changed)")
    out = {}
    for begin, end, name, dtype, shape in entries:
        raw_bytes = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin) if end > begin \
            else torch.empty(0, dtype=torch.uint8)
        if dtype == torch.bool and bool((raw_bytes > 1).any()):
            raise bad(f"bool buffer '{name}' holds a byte other than 0 or 1")
        out[name] = raw_bytes.clone().view(dtype).view(shape).to(expected[name][1])
    return out
