// Sum of squares of an fp32 array on the device, in double, deterministic: a fixed grid of
// kSumSquaresBlocks blocks, each thread summing its grid-stride elements in order, fixed shared-memory
// trees per block and over the block partials (no atomics), so repeated runs give the same bits.
// The order differs from the host's (kernels/cpu Note [Sum of squares order]); both are double sums of
// exact squares, each within n * 2^-53 relative of the exact sum. Caller's stream, caller's workspace,
// no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

inline constexpr unsigned kSumSquaresBlocks = 1024;

// Workspace LaunchSumSquares needs (device memory): kSumSquaresBlocks doubles.
constexpr size_t SumSquaresWorkspaceBytes() { return kSumSquaresBlocks * sizeof(double); }

// *out (device) = sum of double(x[i])^2 for i < n. `workspace`: SumSquaresWorkspaceBytes() of device
// memory, not used by anything else until this work completes on `stream`.
cudaError_t LaunchSumSquares(const float* x, size_t n, double* workspace, double* out, cudaStream_t stream);

}  // namespace strata::kernels::cuda
