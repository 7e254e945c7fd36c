// y = x * s on the device (one IEEE multiply per element, the host's bits). 16-byte accesses,
// grid-stride, caller's stream, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

// y[i] = x[i] * s for i < n; y == x (in place) is allowed, other overlaps are not.
cudaError_t LaunchScale(const float* x, float* y, size_t n, float s, cudaStream_t stream);

}  // namespace strata::kernels::cuda
