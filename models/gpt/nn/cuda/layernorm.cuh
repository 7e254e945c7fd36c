// LayerNorm over the last dimension on the device, the twin of models/gpt/nn/cpu/nn.h LayerNormForward /
// LayerNormBackward: same arguments, same accumulate contract (dx, dw, db accumulated), the same
// per-element functions (models/gpt/nn/common/nn_math.h), two-pass mean and variance.
//
// Forward: one warp per row, warp-shuffle sums (mean, then the squared deviations). Backward: the dx of
// each row likewise; dw and db deterministically (no float atomics): each block takes a fixed chunk of
// kLayerNormRowsPerBlock rows and writes its per-channel partial sums (in row order) to the caller's
// workspace, then a second kernel adds the partials of every channel in block order into dw and db. The
// sums are ordered differently from the host's (tree within a row, chunked over rows), so results agree
// with the host to rounding, and repeated runs give the same bits.
// Caller's stream, caller's memory, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

inline constexpr int kLayerNormRowsPerBlock = 32;

// Workspace LaunchLayerNormBackward needs: ceil(N / kLayerNormRowsPerBlock) * 2 * C floats (0 for N == 0
// or C == 0). N = 8192 rows of C = 768 take 1.5 MiB.
constexpr size_t LayerNormBackwardWorkspaceBytes(int N, int C) {
  const size_t blocks = N <= 0 ? 0 : (static_cast<size_t>(N) + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock;
  return blocks * 2 * static_cast<size_t>(C < 0 ? 0 : C) * sizeof(float);
}

// out[N,C] = (x - mean) * rstd * w + b; writes mean[N], rstd[N] (device pointers).
cudaError_t LaunchLayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean,
                                   float* rstd, int N, int C, float eps, cudaStream_t stream);

// dx[N,C] += ..., dw[C] += ..., db[C] += ... from the forward's mean and rstd. `workspace`:
// LayerNormBackwardWorkspaceBytes(N, C) of device memory, not used by anything else until this work
// completes on `stream`. dx must not overlap the inputs.
cudaError_t LaunchLayerNormBackward(const float* dout, const float* x, const float* w, const float* mean,
                                    const float* rstd, float* dx, float* dw, float* db, int N, int C,
                                    float* workspace, cudaStream_t stream);

}  // namespace strata::kernels::cuda
