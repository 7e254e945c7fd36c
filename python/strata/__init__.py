"""Strata from Python: the C ABI (libstrata.so, strata.h) through ctypes; `strata.torch` shards torch models."""
try:
    # libstrata.so of a CUDA build links libnccl.so.2 and libcudart.so.13, sonames torch's CUDA wheels
    # also load: whichever comes first is the one both use. torch needs its own (newer) NCCL, and Strata's
    # host back-end calls neither, so torch goes first.
    import torch  # noqa: F401
except ImportError:
    pass
from strata._capi import StrataError, lib as _lib  # noqa: E402

__version__ = _lib.strata_version_string().decode()
__all__ = ["StrataError", "__version__"]
