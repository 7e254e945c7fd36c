"""DeepSpeed's checkpoint layout over strata.torch's checkpoints: save_dir/<tag>/ is a checkpoint root of the
engine (it writes save_dir/<tag>/step_<8 digits>/, shards then manifest, each renamed into place), and
save_dir/latest names the tag last saved, written by rank 0 to a temporary file, fsynced and renamed, so it
never names a half-written tag. The loop's own counters and the script's client_state ride in the engine's
trainer state (published with the manifest, so they are in the checkpoint exactly when it is complete)."""
import base64
import io
import json
import os
import warnings

import torch

from strata import _comm

LATEST = "latest"
KEY = "strata.deepspeed"


def check_tag(tag):
    """The tag as a string; the same on every rank (DeepSpeed's checkpoint tag validation, always on)."""
    tag = str(tag)
    if tag in ("", ".", "..") or "/" in tag or "\0" in tag or tag == LATEST:
        raise ValueError(f"strata.deepspeed: checkpoint tag {tag!r} is not a directory name (no '/', not "
                         f"'{LATEST}', '.' or '..')")
    tags = _comm.allgather_object(tag)
    if len(set(tags)) > 1:
        raise ValueError("strata.deepspeed: the ranks gave different checkpoint tags (" +
                         ", ".join(f"rank {r}: {t!r}" for r, t in enumerate(tags)) +
                         "); every rank saves the same checkpoint, so give them the same tag")
    return tag


def encode_client_state(client_state):
    """Collective: _encode on every rank; a rank that cannot encode its own fails every rank (its peers would
    otherwise wait for it in the engine's save)."""
    try:
        encoded, error = _encode(client_state), None
    except TypeError as e:
        encoded, error = None, str(e)
    errors = [(r, e) for r, e in enumerate(_comm.allgather_object(error)) if e is not None]
    if errors:
        rank, message = errors[0]
        raise TypeError(message if rank == _comm.rank() else f"{message} (on rank {rank})")
    return encoded


def _encode(client_state):
    """JSON when it round-trips exactly (readable with `strata ckpt inspect`), else torch.save's bytes, refused
    at save when torch.load(weights_only=True) could not read them back (the load treats them as untrusted)."""
    client_state = {} if client_state is None else client_state
    try:
        if json.loads(json.dumps(client_state)) == client_state:
            return {"json": client_state}
    except (TypeError, ValueError):
        pass
    buf = io.BytesIO()
    torch.save(client_state, buf)
    try:
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except Exception as e:  # noqa: BLE001 (any reason the safe load refuses)
        raise TypeError(f"strata.deepspeed.save_checkpoint: client_state holds something a safe load "
                        f"(torch.load(weights_only=True)) cannot restore ({type(e).__name__}: {e}); keep it to "
                        f"tensors, numbers, strings, lists, tuples and dicts") from None
    return {"torch": base64.b64encode(buf.getvalue()).decode()}


def decode_client_state(stored):
    if "json" in stored:
        return stored["json"]
    return torch.load(io.BytesIO(base64.b64decode(stored["torch"])), weights_only=True)


def write_latest(save_dir, tag):
    """Collective: rank 0 makes save_dir/latest name `tag` (atomically); every rank returns after it did."""
    error = None
    if _comm.rank() == 0:
        path = os.path.join(save_dir, LATEST)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(tag)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(save_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            error = f"strata.deepspeed.save_checkpoint: writing {path}: {e}"
    error = _comm.broadcast_object(error)
    if error:
        raise OSError(error)


def resolve_tag(load_dir, tag):
    """Collective: the tag to load (the given one, or the one save_dir/latest names, read by rank 0), or None when
    there is no latest file (DeepSpeed then loads nothing and warns). Raises, on every rank, for a tag that is
    not there."""
    verdict = None
    if _comm.rank() == 0:
        if tag is None:
            latest = os.path.join(load_dir, LATEST)
            if not os.path.isfile(latest):
                verdict = ("none", f"strata.deepspeed.load_checkpoint: no file {latest}; nothing loaded (save with "
                                   f"save_latest=True, or pass the tag)")
            else:
                with open(latest, encoding="utf-8") as f:
                    tag = f.read().strip()
        if verdict is None:
            path = os.path.join(load_dir, str(tag))
            verdict = ("ok", str(tag)) if os.path.isdir(path) else (
                "missing", f"strata.deepspeed.load_checkpoint: checkpoint tag {str(tag)!r} not found: {path} is "
                           f"not a directory")
    status, value = _comm.broadcast_object(verdict)
    if status == "none":
        if _comm.rank() == 0:
            warnings.warn(value, stacklevel=3)
        return None
    if status == "missing":
        raise FileNotFoundError(value)
    return value


def save_weights(engine, save_dir, save_filename, exclude_frozen_parameters):
    """Collective: the model's full state dict in the engine's parameter dtype (fp32, or bf16 with bf16
    parameters), written by rank 0 with torch.save to save_dir/save_filename (a temporary name, then renamed)."""
    from strata.torch._buffers import _TORCH_DTYPE  # noqa: PLC0415
    dtype = _TORCH_DTYPE[engine.strata.units[0].layout.dtype][0]
    params = dict(engine.module.named_parameters(remove_duplicate=False))  # tied names each
    state = engine.module.state_dict()  # every rank takes part in the gathers
    state = {k: (v.to(dtype) if k in params else v) for k, v in state.items()
             if not (exclude_frozen_parameters and k in params and not params[k].requires_grad)}
    error = None
    if _comm.rank() == 0:
        path = os.path.join(os.fspath(save_dir), save_filename)
        try:
            os.makedirs(os.fspath(save_dir), exist_ok=True)
            torch.save(state, f"{path}.tmp.{os.getpid()}")
            os.replace(f"{path}.tmp.{os.getpid()}", path)
        except OSError as e:
            error = f"strata.deepspeed.save_16bit_model: writing {path}: {e}"
    error = _comm.broadcast_object(error)
    if error:
        raise OSError(error)
