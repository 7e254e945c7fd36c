// Scale kernel (see scale.cuh).
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/scale.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void ScaleKernel(const float* x, float* y, size_t n, float s, VectorSplit sp) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = tid; j < sp.vecs; j += stride) {
    const size_t i = sp.head + j * kVec;
    Float8 v = Load8(x + i);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v.v[k] = v.v[k] * s;
    Store8(y + i, v);
  }
  const size_t rest = sp.head + sp.vecs * kVec;
  for (size_t k = tid; k < sp.head + (n - rest); k += stride) {
    const size_t i = k < sp.head ? k : rest + (k - sp.head);
    y[i] = x[i] * s;
  }
}

}  // namespace

cudaError_t LaunchScale(const float* x, float* y, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int phases[2] = {AlignedPhase(x, 4), AlignedPhase(y, 4)};
  const size_t periods[2] = {4, 4};
  size_t head = 0;
  const VectorSplit sp = SplitFor(n, CommonHead(phases, periods, 2, &head), head);
  ScaleKernel<<<GridFor(sp.vecs > 0 ? sp.vecs : n), kBlockThreads, 0, stream>>>(x, y, n, s, sp);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
