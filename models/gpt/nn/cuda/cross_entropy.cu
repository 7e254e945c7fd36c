// Cross-entropy kernels (see cross_entropy.cuh).
#include "kernels/cuda/launch_util.cuh"
#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cuda/cross_entropy.cuh"
#include "models/gpt/nn/cuda/reduce_util.cuh"

namespace strata::kernels::cuda {
namespace {

// In place (probs == logits): the target logit is read before the first barrier, and every other
// element is read and then written by the same thread, after the max pass's barriers.
__global__ void CrossEntropyRowsKernel(const float* logits, const int32_t* targets, float* probs, float* losses,
                                       int N, int V) {
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float* l = logits + static_cast<size_t>(row) * V;
    float* p = probs + static_cast<size_t>(row) * V;
    const int32_t t = targets[row];
    const float target_logit = ValidTarget(t, V) ? l[t] : QuietNaN();
    float mx = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = MaxOp{}(mx, l[j]);
    mx = BlockMax(mx);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float e = Exp(l[j] - mx);
      p[j] = e;
      sum += e;
    }
    sum = BlockSum(sum);
    const float inv = SoftmaxInv(sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
    if (threadIdx.x == 0) losses[row] = CrossEntropyLoss(sum, target_logit, mx);
  }
}

__global__ void MeanLossKernel(const float* losses, int N, double* mean_loss) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) acc += losses[i];
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) *mean_loss = total / N;  // N == 0: 0/0 = NaN, the mean of no rows
}

__global__ void CrossEntropyBackwardKernel(const float* probs, const int32_t* targets, float* dlogits, float dloss,
                                           int N, int V) {
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t off = static_cast<size_t>(row) * V;
    const int32_t t = targets[row];
    const bool valid = ValidTarget(t, V);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      dlogits[off + j] = valid ? CrossEntropyGrad(probs[off + j], j == t, dloss) : QuietNaN();
    }
  }
}

}  // namespace

cudaError_t LaunchCrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                      int N, int V, double* mean_loss, cudaStream_t stream) {
  if (N > 0) {
    CrossEntropyRowsKernel<<<GridForRows(N), kBlockThreads, 0, stream>>>(logits, targets, probs, losses, N, V);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (mean_loss == nullptr) return cudaSuccess;
  MeanLossKernel<<<1, kBlockThreads, 0, stream>>>(losses, N < 0 ? 0 : N, mean_loss);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss,
                                       int N, int V, cudaStream_t stream) {
  if (N <= 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<GridForRows(N), kBlockThreads, 0, stream>>>(probs, targets, dlogits, dloss, N, V);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
