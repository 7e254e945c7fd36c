// Fused AdamW kernel (see adamw.cuh).
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/copy_store.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/optimizer_split.cuh"

namespace strata::kernels::cuda {
namespace {

template <ParamCopy kCopy>
__device__ __forceinline__ void AdamW1(const OptimizerArrays& a, size_t i, const AdamWCoeffs<float>& c, float gs) {
  float p = a.master[i], m = a.m[i], v = a.v[i];
  AdamWUpdate(a.grad[i] * gs, p, m, v, c);
  a.master[i] = p;
  a.m[i] = m;
  a.v[i] = v;
  StoreCopy1<kCopy>(a.param_copy + i, p);
}

template <ParamCopy kCopy>
__device__ __forceinline__ void AdamW8(const OptimizerArrays& a, size_t i, const AdamWCoeffs<float>& c, float gs) {
  const Float8 g = Load8(a.grad + i);
  Float8 p = Load8(a.master + i), m = Load8(a.m + i), v = Load8(a.v + i);
#pragma unroll
  for (int j = 0; j < kVec; ++j) AdamWUpdate(g.v[j] * gs, p.v[j], m.v[j], v.v[j], c);
  Store8(a.master + i, p);
  Store8(a.m + i, m);
  Store8(a.v + i, v);
  StoreCopy8<kCopy>(a.param_copy + i, p);
}

// Elements begin + [0, head) and the rest after the vectors one by one; the vectors 8 at a time.
template <ParamCopy kCopy>
__global__ void AdamWKernel(OptimizerArrays a, size_t begin, size_t n, VectorSplit s, AdamWCoeffs<float> c,
                            float gs) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = tid; j < s.vecs; j += stride) AdamW8<kCopy>(a, begin + s.head + j * kVec, c, gs);
  const size_t rest = s.head + s.vecs * kVec;
  for (size_t i = tid; i < s.head + (n - rest); i += stride) {
    AdamW1<kCopy>(a, begin + (i < s.head ? i : rest + (i - s.head)), c, gs);
  }
}

}  // namespace

cudaError_t LaunchAdamW(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c,
                        float grad_scale, cudaStream_t stream) {
  if (end <= begin) return cudaSuccess;
  const size_t n = end - begin;
  const VectorSplit s = OptimizerSplit(a, begin, end);
  const unsigned grid = GridFor(s.vecs > 0 ? s.vecs : n);
  switch (a.copy) {
    case ParamCopy::kNone:
      AdamWKernel<ParamCopy::kNone><<<grid, kBlockThreads, 0, stream>>>(a, begin, n, s, c, grad_scale);
      break;
    case ParamCopy::kBf16:
      AdamWKernel<ParamCopy::kBf16><<<grid, kBlockThreads, 0, stream>>>(a, begin, n, s, c, grad_scale);
      break;
    case ParamCopy::kF16:
      AdamWKernel<ParamCopy::kF16><<<grid, kBlockThreads, 0, stream>>>(a, begin, n, s, c, grad_scale);
      break;
  }
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
