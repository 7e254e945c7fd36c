// SGD-momentum kernel (see sgd.cuh).
#include "kernels/cuda/copy_store.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/optimizer_split.cuh"
#include "kernels/cuda/sgd.cuh"

namespace strata::kernels::cuda {
namespace {

template <ParamCopy kCopy>
__device__ __forceinline__ void Sgd1(const OptimizerArrays& a, size_t i, const SgdStep& c, float gs) {
  float p = a.master[i], buf = a.m[i];
  SgdUpdate(a.grad[i] * gs, p, buf, c.lr, c.momentum, c.weight_decay);
  a.master[i] = p;
  a.m[i] = buf;
  StoreCopy1<kCopy>(a.param_copy + i, p);
}

template <ParamCopy kCopy>
__device__ __forceinline__ void Sgd8(const OptimizerArrays& a, size_t i, const SgdStep& c, float gs) {
  const Float8 g = Load8(a.grad + i);
  Float8 p = Load8(a.master + i), buf = Load8(a.m + i);
#pragma unroll
  for (int j = 0; j < kVec; ++j) SgdUpdate(g.v[j] * gs, p.v[j], buf.v[j], c.lr, c.momentum, c.weight_decay);
  Store8(a.master + i, p);
  Store8(a.m + i, buf);
  StoreCopy8<kCopy>(a.param_copy + i, p);
}

template <ParamCopy kCopy>
__global__ void SgdKernel(OptimizerArrays a, size_t begin, size_t n, VectorSplit s, SgdStep c, float gs) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = tid; j < s.vecs; j += stride) Sgd8<kCopy>(a, begin + s.head + j * kVec, c, gs);
  const size_t rest = s.head + s.vecs * kVec;
  for (size_t i = tid; i < s.head + (n - rest); i += stride) {
    Sgd1<kCopy>(a, begin + (i < s.head ? i : rest + (i - s.head)), c, gs);
  }
}

}  // namespace

cudaError_t LaunchSgd(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& step, float grad_scale,
                      cudaStream_t stream) {
  if (end <= begin) return cudaSuccess;
  OptimizerArrays no_v = a;
  no_v.v = nullptr;  // unused: no alignment constraint from it
  const size_t n = end - begin;
  const VectorSplit s = OptimizerSplit(no_v, begin, end);
  const unsigned grid = GridFor(s.vecs > 0 ? s.vecs : n);
  switch (a.copy) {
    case ParamCopy::kNone:
      SgdKernel<ParamCopy::kNone><<<grid, kBlockThreads, 0, stream>>>(no_v, begin, n, s, step, grad_scale);
      break;
    case ParamCopy::kBf16:
      SgdKernel<ParamCopy::kBf16><<<grid, kBlockThreads, 0, stream>>>(no_v, begin, n, s, step, grad_scale);
      break;
    case ParamCopy::kF16:
      SgdKernel<ParamCopy::kF16><<<grid, kBlockThreads, 0, stream>>>(no_v, begin, n, s, step, grad_scale);
      break;
  }
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
