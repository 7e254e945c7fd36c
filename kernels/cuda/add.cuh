// Residual adds on the device (models/gpt/nn/cpu/nn.h AddInto / Add): one IEEE add an element, the host's
// bits. 16-byte accesses where aligned, grid-stride, caller's stream, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

// dst[i] += src[i] for i < n (device pointers; dst == src allowed).
cudaError_t LaunchAddInto(float* dst, const float* src, size_t n, cudaStream_t stream);

// out[i] = a[i] + b[i] for i < n (out may be a or b).
cudaError_t LaunchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t stream);

}  // namespace strata::kernels::cuda
