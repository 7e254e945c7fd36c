// Deterministic sum of squares (see sum_squares.cuh).
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sum_squares.cuh"

namespace strata::kernels::cuda {
namespace {

// Fixed tree over the block's kBlockThreads values in shared memory; thread 0 gets the sum.
__device__ double BlockSum(double v) {
  __shared__ double s[kBlockThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (unsigned w = kBlockThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

__global__ void PartialSums(const float* x, size_t n, VectorSplit sp, double* partial) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (size_t j = tid; j < sp.vecs; j += stride) {
    const Float8 v = Load8(x + sp.head + j * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc += static_cast<double>(v.v[k]) * v.v[k];
  }
  const size_t rest = sp.head + sp.vecs * kVec;
  for (size_t k = tid; k < sp.head + (n - rest); k += stride) {
    const double d = x[k < sp.head ? k : rest + (k - sp.head)];
    acc += d * d;
  }
  const double block = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = block;
}

__global__ void FinalSum(const double* partial, double* out) {
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < kSumSquaresBlocks; i += blockDim.x) acc += partial[i];
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

cudaError_t LaunchSumSquares(const float* x, size_t n, double* workspace, double* out, cudaStream_t stream) {
  const int phase = AlignedPhase(x, 4);
  const VectorSplit sp = SplitFor(n, phase >= 0, phase >= 0 ? static_cast<size_t>(phase) : 0);
  PartialSums<<<kSumSquaresBlocks, kBlockThreads, 0, stream>>>(x, n, sp, workspace);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  FinalSum<<<1, kBlockThreads, 0, stream>>>(workspace, out);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
