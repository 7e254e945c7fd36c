// LayerNorm kernels (see layernorm.cuh).
#include "kernels/cuda/launch_util.cuh"
#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cuda/layernorm.cuh"
#include "models/gpt/nn/cuda/reduce_util.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = kBlockThreads / kWarpThreads;

// One warp per row; lane l takes channels l, l + 32, ...
__global__ void LayerNormForwardKernel(const float* x, const float* w, const float* b, float* out, float* mean,
                                       float* rstd, int N, int C, float eps) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpThreads;
  const int lane = threadIdx.x % kWarpThreads;
  if (row >= N) return;  // whole warps leave together; no block-wide synchronisation follows
  const size_t off = static_cast<size_t>(row) * C;
  const float* xr = x + off;
  float sum = 0.0f;
  for (int j = lane; j < C; j += kWarpThreads) sum += xr[j];
  const float m = RowMean(WarpSum(sum), C);
  float sq = 0.0f;
  for (int j = lane; j < C; j += kWarpThreads) {
    const float d = xr[j] - m;
    sq += d * d;
  }
  const float r = LayerNormRstd(WarpSum(sq), C, eps);
  for (int j = lane; j < C; j += kWarpThreads) out[off + j] = LayerNormOut(xr[j], m, r, w[j], b[j]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Block k owns rows [k * kLayerNormRowsPerBlock, ...): its warps accumulate dx row by row, then its
// threads, one channel each, sum dw and db terms over the block's rows in row order into
// workspace[k] = {dw partial[C], db partial[C]}.
__global__ void LayerNormBackwardKernel(const float* dout, const float* x, const float* w, const float* mean,
                                        const float* rstd, float* dx, int N, int C, float* workspace) {
  const int row0 = blockIdx.x * kLayerNormRowsPerBlock;
  const int row1 = min(N, row0 + kLayerNormRowsPerBlock);
  const int lane = threadIdx.x % kWarpThreads;
  for (int row = row0 + static_cast<int>(threadIdx.x / kWarpThreads); row < row1; row += kWarpsPerBlock) {
    const size_t off = static_cast<size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float sum_g = 0.0f, sum_gn = 0.0f;
    for (int j = lane; j < C; j += kWarpThreads) {
      const float g = w[j] * dout[off + j];
      sum_g += g;
      sum_gn += g * LayerNormNormalized(x[off + j], m, r);
    }
    const float mean_g = RowMean(WarpSum(sum_g), C);
    const float mean_gn = RowMean(WarpSum(sum_gn), C);
    for (int j = lane; j < C; j += kWarpThreads) {
      dx[off + j] += LayerNormDx(x[off + j], m, r, w[j], dout[off + j], mean_g, mean_gn);
    }
  }
  float* part_dw = workspace + static_cast<size_t>(blockIdx.x) * 2 * C;
  float* part_db = part_dw + C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc_dw = 0.0f, acc_db = 0.0f;
    for (int row = row0; row < row1; ++row) {
      const size_t i = static_cast<size_t>(row) * C + c;
      acc_db += dout[i];
      acc_dw += LayerNormNormalized(x[i], mean[row], rstd[row]) * dout[i];
    }
    part_dw[c] = acc_dw;
    part_db[c] = acc_db;
  }
}

// dw[c] += sum over blocks k (in order) of workspace[k].dw[c]; likewise db.
__global__ void LayerNormParamGradKernel(const float* workspace, int blocks, float* dw, float* db, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum_dw = 0.0f, sum_db = 0.0f;
  for (int k = 0; k < blocks; ++k) {
    sum_dw += workspace[static_cast<size_t>(k) * 2 * C + c];
    sum_db += workspace[static_cast<size_t>(k) * 2 * C + C + c];
  }
  dw[c] += sum_dw;
  db[c] += sum_db;
}

}  // namespace

cudaError_t LaunchLayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean,
                                   float* rstd, int N, int C, float eps, cudaStream_t stream) {
  if (N <= 0) return cudaSuccess;
  LayerNormForwardKernel<<<BlocksFor(N, kWarpsPerBlock), kBlockThreads, 0, stream>>>(x, w, b, out, mean, rstd, N,
                                                                                      C, eps);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const float* dout, const float* x, const float* w, const float* mean,
                                    const float* rstd, float* dx, float* dw, float* db, int N, int C,
                                    float* workspace, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  const unsigned blocks = BlocksFor(N, kLayerNormRowsPerBlock);
  LayerNormBackwardKernel<<<blocks, kBlockThreads, 0, stream>>>(dout, x, w, mean, rstd, dx, N, C, workspace);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  LayerNormParamGradKernel<<<BlocksFor(C, kBlockThreads), kBlockThreads, 0, stream>>>(
      workspace, static_cast<int>(blocks), dw, db, C);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
