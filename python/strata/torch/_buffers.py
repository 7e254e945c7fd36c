"""Torch views of the buffers the engine returns (zero copy) and the placeholders between uses.

Views are made over the pointers of strata_unit_buffers: one flat tensor per gathered unit (the
parameters are packed at their offset_elems in it), so every parameter view, and every view an op takes of
it, shares the flat tensor's storage: that is how the saved-tensor hooks recognise a parameter.
Gradients are fp32 views of each parameter's gradient pointer. Between uses a parameter holds an empty
tensor (numel 0; torch's set_data refuses a meta tensor for a CPU parameter), so any op reading it outside
its unit fails on the shape instead of reading a buffer the engine has released.
"""
import ctypes

import torch

from strata import _capi

_TORCH_DTYPE = {_capi.DTYPE_F32: (torch.float32, ctypes.c_float), _capi.DTYPE_BF16: (torch.bfloat16, ctypes.c_uint16),
                _capi.DTYPE_F16: (torch.float16, ctypes.c_uint16)}


def flat_view(address, numel, dtype):
    """A 1-D tensor over `numel` elements at `address` (memory the engine owns)."""
    tdtype, ctype = _TORCH_DTYPE[dtype]
    return torch.frombuffer((ctype * numel).from_address(address), dtype=tdtype)


def placeholder(dtype=torch.float32):
    return torch.empty(0, dtype=dtype)


class Layout:
    """Shapes and offsets of one unit's parameters, read back from the engine after registration."""

    def __init__(self, shapes, offsets, numels, dtype):
        self.shapes, self.offsets, self.numels, self.dtype = shapes, offsets, numels, dtype
        self.total = max(o + n for o, n in zip(offsets, numels))

    def param_views(self, bufs):
        base = bufs.params[0] - self.offsets[0] * torch.empty((), dtype=_TORCH_DTYPE[self.dtype][0]).element_size()
        flat = flat_view(base, self.total, self.dtype)
        return flat, [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def grad_views(self, bufs):
        return [flat_view(ctypes.cast(bufs.grads[i], ctypes.c_void_p).value, n, _capi.DTYPE_F32).view(s)
                for i, (n, s) in enumerate(zip(self.numels, self.shapes))]
