"""Torch views of the buffers the engine returns (zero copy) and the placeholders between uses.

Views are made over the pointers of strata_unit_buffers: one flat tensor per gathered unit (the
parameters are packed at their offset_elems in it), so every parameter view, and every view an op takes of
it, shares the flat tensor's storage: that is how the saved-tensor hooks recognise a parameter.
Gradients are fp32 views of each parameter's gradient pointer. Between uses a parameter holds an empty
tensor (numel 0; torch's set_data refuses a meta tensor for a CPU parameter), so it holds no pointer into a
buffer the engine has released, and _sharded refuses every op that would read or write it there (Note
[Parameters between uses]).
On CUDA (unverified on a GPU) the views are CUDA tensors over the engine's device pointers, made through
__cuda_array_interface__ (torch.as_tensor, zero copy), and the placeholders are empty CUDA tensors.
"""
import ctypes

import torch

from strata import _capi

_TORCH_DTYPE = {_capi.DTYPE_F32: (torch.float32, ctypes.c_float), _capi.DTYPE_BF16: (torch.bfloat16, ctypes.c_uint16),
                _capi.DTYPE_F16: (torch.float16, ctypes.c_uint16)}


# __cuda_array_interface__ type strings: numpy's, which has no bfloat16, so bf16 travels as int16 bits and
# is reinterpreted (Tensor.view(dtype), no copy).
_CUDA_TYPESTR = {_capi.DTYPE_F32: ("<f4", None), _capi.DTYPE_BF16: ("<i2", torch.bfloat16),
                 _capi.DTYPE_F16: ("<f2", None)}


def cuda_array_interface(address, numel, dtype):
    """The __cuda_array_interface__ (version 3) of `numel` elements of strata_dtype `dtype` at device address
    `address`. "stream": None says no synchronisation is needed: begin_forward / begin_backward return once
    the unit's gather has completed (the host waited for it), so any kernel torch queues afterwards reads the
    gathered values."""
    if address is None or address == 0:
        raise ValueError("strata: the engine returned a NULL device pointer")
    return {"shape": (int(numel),), "typestr": _CUDA_TYPESTR[dtype][0], "data": (int(address), False),
            "strides": None, "version": 3, "stream": None}


class CudaBuffer:
    """Memory the engine owns on the GPU, as an object torch.as_tensor takes without copying."""

    def __init__(self, address, numel, dtype):
        self.__cuda_array_interface__ = cuda_array_interface(address, numel, dtype)


def flat_view(address, numel, dtype, device=None):
    """A 1-D tensor over `numel` elements at `address` (memory the engine owns: host memory, or on a CUDA
    `device` the engine's device buffer; unverified on a GPU)."""
    tdtype, ctype = _TORCH_DTYPE[dtype]
    if device is None or device.type == "cpu":
        return torch.frombuffer((ctype * numel).from_address(address), dtype=tdtype)
    t = torch.as_tensor(CudaBuffer(address, numel, dtype), device=device)
    bits = _CUDA_TYPESTR[dtype][1]
    return t.view(bits) if bits is not None else t


def placeholder(dtype=torch.float32, device=None):
    return torch.empty(0, dtype=dtype, device=device)


class Layout:
    """Shapes and offsets of one unit's parameters, read back from the engine after registration."""

    def __init__(self, shapes, offsets, numels, dtype, device=None):
        self.shapes, self.offsets, self.numels, self.dtype = shapes, offsets, numels, dtype
        self.device = device  # None: host memory
        self.total = max(o + n for o, n in zip(offsets, numels))

    def param_views(self, bufs):
        base = bufs.params[0] - self.offsets[0] * torch.empty((), dtype=_TORCH_DTYPE[self.dtype][0]).element_size()
        flat = flat_view(base, self.total, self.dtype, self.device)
        return flat, [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def grad_views(self, bufs):
        return [flat_view(ctypes.cast(bufs.grads[i], ctypes.c_void_p).value, n, _capi.DTYPE_F32,
                          self.device).view(s)
                for i, (n, s) in enumerate(zip(self.numels, self.shapes))]
