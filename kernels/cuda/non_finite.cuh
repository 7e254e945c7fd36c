// Counting Inf / NaN elements of an fp32 array on the device (the overflow check of dynamic loss scaling
// and the non-finite gradient guard). 16-byte loads, grid-stride, one atomic per block into the caller's
// counter (an integer count, so the result is exact and order-free). Caller's stream, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

// *count (device) = number of i < n with x[i] Inf or NaN. The counter is zeroed on `stream` first.
cudaError_t LaunchCountNonFinite(const float* x, size_t n, unsigned long long* count, cudaStream_t stream);

}  // namespace strata::kernels::cuda
