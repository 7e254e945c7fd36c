// Non-finite counting kernel (see non_finite.cuh).
#include "kernels/common/element_math.h"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/non_finite.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void CountKernel(const float* x, size_t n, VectorSplit sp, unsigned long long* count) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned long long c = 0;
  for (size_t j = tid; j < sp.vecs; j += stride) {
    const Float8 v = Load8(x + sp.head + j * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) c += IsFinite(v.v[k]) ? 0 : 1;
  }
  const size_t rest = sp.head + sp.vecs * kVec;
  for (size_t k = tid; k < sp.head + (n - rest); k += stride) {
    c += IsFinite(x[k < sp.head ? k : rest + (k - sp.head)]) ? 0 : 1;
  }
  for (int off = 16; off > 0; off /= 2) c += __shfl_down_sync(0xffffffffu, c, off);
  __shared__ unsigned long long warp_sums[kBlockThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kBlockThreads / 32; ++w) total += warp_sums[w];
    if (total != 0) atomicAdd(count, total);
  }
}

}  // namespace

cudaError_t LaunchCountNonFinite(const float* x, size_t n, unsigned long long* count, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(count, 0, sizeof(*count), stream);
  if (e != cudaSuccess || n == 0) return e;
  const int phase = AlignedPhase(x, 4);
  const VectorSplit sp = SplitFor(n, phase >= 0, phase >= 0 ? static_cast<size_t>(phase) : 0);
  CountKernel<<<GridFor(sp.vecs > 0 ? sp.vecs : n), kBlockThreads, 0, stream>>>(x, n, sp, count);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
