"""ctypes bindings of Strata's C ABI (strata.h), the only boundary this package depends on.

Every struct mirrors its C layout and is created through its *_INIT equivalent (`new(T)`), which sets
struct_size and version as the macros do. Every call goes through `check`, which turns a non-OK status into
a StrataError carrying the code's name and strata_last_error()'s message.
"""
import ctypes
import os

ABI_VERSION = 1
c_int32, c_int64, c_uint32, c_uint64, c_float, c_double = (ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32,
                                                           ctypes.c_uint64, ctypes.c_float, ctypes.c_double)
c_void_p, c_char_p, c_size_t = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
INIT_ZEROS = 0
ERR_FAILED_PRECONDITION, ERR_DEADLINE_EXCEEDED, ERR_INTERNAL = 2, 5, 10


class StrataError(RuntimeError):
    """A strata_* call failed: `code` is the status name (STRATA_ERR_...), the message the library's."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


class _Versioned(ctypes.Structure):
    @classmethod
    def new(cls, **fields):
        s = cls(struct_size=ctypes.sizeof(cls), version=ABI_VERSION)
        for k, v in getattr(cls, "_defaults", {}).items():
            setattr(s, k, v)
        for k, v in fields.items():
            setattr(s, k, v)
        return s


class EngineOptions(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("config_json", c_char_p), ("device", c_int32),
                ("reserved", c_int32), ("hidden_size", c_int64)]


class ParamSpec(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("name", c_char_p),
                ("shape", ctypes.POINTER(c_int64)), ("ndim", c_int32), ("weight_decay", c_int32),
                ("init", c_int32), ("init_value", c_float), ("frozen", c_int32), ("reserved", c_int32),
                ("has_own_lr", c_int32), ("has_own_weight_decay", c_int32), ("own_lr", c_double),
                ("own_weight_decay", c_double)]


class ParamInfo(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("name", c_char_p),
                ("shape", ctypes.POINTER(c_int64)), ("numel", c_uint64), ("offset_elems", c_uint64),
                ("ndim", c_int32), ("dtype", c_int32), ("weight_decay", c_int32)]


class UnitBuffers(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("num_params", c_int32),
                ("param_dtype", c_int32), ("params", ctypes.POINTER(c_void_p)),
                ("grads", ctypes.POINTER(ctypes.POINTER(c_float)))]


class StepResult(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("step", c_int64), ("skipped", c_int32),
                ("clip_coef", c_float), ("grad_norm", c_double), ("lr", c_double), ("loss_scale", c_double)]


class Stats(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32)] + [
        (n, c_uint64) for n in ("device_current_bytes", "device_peak_bytes", "pinned_host_current_bytes",
                                "pinned_host_peak_bytes", "nvme_current_bytes", "nvme_peak_bytes")] + [
        ("steps", c_int64), ("loss_scale", c_double)] + [
        (n, c_double) for n in ("last_step_ms", "last_compute_ms", "last_exposed_comm_ms", "last_exposed_io_ms",
                                "last_optimizer_ms", "last_other_ms")]


class SafetensorsTensor(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("name", c_char_p), ("dtype", c_char_p),
                ("shape", ctypes.POINTER(c_int64)), ("ndim", c_int32), ("reserved", c_int32),
                ("data_begin", c_uint64), ("data_end", c_uint64), ("file", c_char_p), ("file_data_bytes", c_uint64)]


class LoadOptions(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("io_backend", c_int32), ("io_depth", c_uint32),
                ("staging_bytes", c_uint64), ("staging_buffers", c_uint32), ("reserved", c_uint32)]


class LoadStats(_Versioned):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("bytes_read", c_uint64), ("requests", c_uint64),
                ("fixed_buffer_ios", c_uint64), ("elements", c_uint64), ("seconds", c_double),
                ("backend", ctypes.c_char * 64), ("nvme_bytes_written", c_uint64), ("nvme_bytes_read", c_uint64)]


class ForeignComm(_Versioned):
    """strata_foreign_comm: a trainer's communicator as callbacks (strata.h; strata._torch_comm fills it)."""
    _defaults = {"size": 1}


_S, _E = c_int32, [c_void_p, c_size_t]  # every callback's status, and its error buffer and capacity
_BUFFERS = [c_void_p, c_void_p, c_void_p, c_size_t, c_int32]  # user, send, recv, count, dtype
ForeignComm._fields_ = [
    ("struct_size", c_uint32), ("version", c_uint32), ("user", c_void_p), ("rank", c_int32), ("size", c_int32),
    ("all_gather", ctypes.CFUNCTYPE(_S, *_BUFFERS, *_E)),
    ("reduce_scatter", ctypes.CFUNCTYPE(_S, *_BUFFERS, *_E)),
    ("all_reduce", ctypes.CFUNCTYPE(_S, *_BUFFERS, *_E)),
    ("broadcast", ctypes.CFUNCTYPE(_S, c_void_p, c_void_p, c_size_t, c_int32, c_int32, *_E)),
    ("barrier", ctypes.CFUNCTYPE(_S, c_void_p, *_E)),
    ("dup", ctypes.CFUNCTYPE(_S, c_void_p, c_int64, ctypes.POINTER(ForeignComm), *_E)),
    ("split", ctypes.CFUNCTYPE(_S, c_void_p, ctypes.POINTER(c_int32), ctypes.POINTER(c_int32), c_int64,
                               ctypes.POINTER(ForeignComm), *_E)),
    ("destroy", ctypes.CFUNCTYPE(None, c_void_p)),
    ("kv_set", ctypes.CFUNCTYPE(_S, c_void_p, c_char_p, c_void_p, c_size_t, *_E)),
    ("kv_get", ctypes.CFUNCTYPE(_S, c_void_p, c_char_p, c_void_p, c_size_t, ctypes.POINTER(c_int64), *_E)),
    ("abort", ctypes.CFUNCTYPE(None, c_void_p, c_char_p))]


_P = ctypes.POINTER
_SIGNATURES = {  # name: argument types (every function returns a strata_status unless listed in _OTHER)
    "strata_comm_create_mpi": [c_int32, _P(c_void_p)],
    "strata_comm_create_torchrun": [c_int64, _P(c_void_p)],
    "strata_comm_watch_torchrun": [],
    "strata_comm_create_foreign": [_P(ForeignComm), c_int64, _P(c_void_p)],
    "strata_comm_create_shm": [c_void_p, c_int64, _P(c_void_p)],
    "strata_comm_create_in_process": [c_int32, _P(c_void_p)],
    "strata_comm_rank": [c_void_p, _P(c_int32)],
    "strata_comm_size": [c_void_p, _P(c_int32)],
    "strata_comm_abort": [c_void_p, c_char_p],
    "strata_comm_destroy": [c_void_p],
    "strata_engine_create": [c_void_p, _P(EngineOptions), _P(c_void_p)],
    "strata_engine_register_unit": [c_void_p, c_char_p, _P(ParamSpec), c_int32, _P(c_int32)],
    "strata_engine_finalize": [c_void_p],
    "strata_engine_param_info": [c_void_p, c_int32, c_int32, _P(ParamInfo)],
    "strata_engine_begin_micro_batch": [c_void_p],
    "strata_engine_end_micro_batch": [c_void_p],
    "strata_engine_begin_forward": [c_void_p, c_int32, _P(UnitBuffers)],
    "strata_engine_end_forward": [c_void_p, c_int32],
    "strata_engine_begin_backward": [c_void_p, c_int32, _P(UnitBuffers)],
    "strata_engine_end_backward": [c_void_p, c_int32],
    "strata_engine_mark_no_grad": [c_void_p, c_int32, c_int32],
    "strata_engine_param": [c_void_p, c_int32, c_int32, _P(c_void_p)],
    "strata_engine_grad": [c_void_p, c_int32, c_int32, _P(_P(c_float))],
    "strata_engine_num_units": [c_void_p, _P(c_int32)],
    "strata_engine_num_params": [c_void_p, c_int32, _P(c_int32)],
    "strata_engine_zero_grad": [c_void_p],
    "strata_engine_step": [c_void_p, _P(StepResult)],
    "strata_engine_loss_scale": [c_void_p, _P(c_float)],
    "strata_engine_lr": [c_void_p, _P(c_double)],
    "strata_engine_group_lr": [c_void_p, c_int32, c_double, _P(c_double)],
    "strata_engine_config_json": [c_void_p, _P(c_char_p)],
    "strata_engine_gather_param": [c_void_p, c_int32, c_int32, c_void_p, c_size_t],
    "strata_engine_set_param": [c_void_p, c_int32, c_int32, c_void_p, c_size_t],
    "strata_engine_gather_unit": [c_void_p, c_int32, c_void_p, c_size_t],
    "strata_engine_held_range": [c_void_p, c_int32, _P(c_uint64), _P(c_uint64)],
    "strata_engine_set_param_range": [c_void_p, c_int32, c_int32, c_uint64, c_void_p, c_size_t],
    "strata_engine_save_checkpoint": [c_void_p, c_char_p, c_char_p],
    "strata_engine_save_checkpoint_async": [c_void_p, c_char_p, c_char_p],
    "strata_engine_wait_checkpoint": [c_void_p],
    "strata_engine_checkpoint_in_flight": [c_void_p, _P(c_int32)],
    "strata_engine_load_checkpoint": [c_void_p, c_char_p, _P(c_char_p)],
    "strata_safetensors_open": [c_char_p, _P(c_void_p)],
    "strata_safetensors_close": [c_void_p],
    "strata_safetensors_num_tensors": [c_void_p, _P(c_size_t)],
    "strata_safetensors_tensor_info": [c_void_p, c_size_t, _P(SafetensorsTensor)],
    "strata_safetensors_read": [c_void_p, c_size_t, c_uint64, c_void_p, c_size_t],
    "strata_engine_load_safetensors": [c_void_p, c_void_p, _P(c_int32), _P(c_int32), _P(c_uint64), c_size_t,
                                       _P(LoadOptions), _P(LoadStats)],
    "strata_engine_load_safetensors_at": [c_void_p, c_void_p, _P(c_int32), _P(c_int32), _P(c_uint64),
                                          _P(c_uint64), c_size_t, _P(LoadOptions), _P(LoadStats)],
    "strata_engine_get_stats": [c_void_p, _P(Stats)],
    "strata_engine_reset_peak_memory": [c_void_p],
    "strata_engine_destroy": [c_void_p],
}
_OTHER = {"strata_last_error": ([], c_char_p), "strata_status_name": ([c_int32], c_char_p),
          "strata_abi_version": ([], c_uint32), "strata_version_string": ([], c_char_p)}


def library_path():
    """STRATA_LIBRARY if set (a libstrata.so of a build tree), else the copy installed with this package."""
    env = os.environ.get("STRATA_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", f"libstrata.so.{ABI_VERSION}")


def _load():
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(f"strata: the library {path} does not exist (reinstall the package, or set "
                          f"STRATA_LIBRARY to a libstrata.so.{ABI_VERSION})")
    lib = ctypes.CDLL(path)
    for name, args in _SIGNATURES.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, c_int32
    for name, (args, res) in _OTHER.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    if lib.strata_abi_version() != ABI_VERSION:
        raise ImportError(f"strata: {path} has ABI version {lib.strata_abi_version()}, this package needs "
                          f"{ABI_VERSION}")
    return lib


lib = _load()


def check(status):
    """Raises StrataError for a non-OK status, with the calling thread's last error message (which may quote bytes
    of a damaged file that are not UTF-8: they are shown as U+FFFD)."""
    if status != 0:
        raise StrataError(lib.strata_status_name(status).decode(), lib.strata_last_error().decode(errors="replace"))
