// Cast kernel (see cast.cuh).
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/copy_store.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace strata::kernels::cuda {
namespace {

template <ParamCopy kTo>
__global__ void CastKernel(const float* x, uint16_t* y, size_t n, VectorSplit s) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = tid; j < s.vecs; j += stride) {
    const size_t i = s.head + j * kVec;
    StoreCopy8<kTo>(y + i, Load8(x + i));
  }
  const size_t rest = s.head + s.vecs * kVec;
  for (size_t k = tid; k < s.head + (n - rest); k += stride) {
    const size_t i = k < s.head ? k : rest + (k - s.head);
    StoreCopy1<kTo>(y + i, x[i]);
  }
}

template <ParamCopy kFrom>
__global__ void WidenKernel(const uint16_t* x, float* y, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    y[i] = kFrom == ParamCopy::kBf16 ? Bf16ToFloat(x[i]) : HalfToFloat(x[i]);
  }
}

}  // namespace

cudaError_t LaunchWiden(const uint16_t* x, float* y, size_t n, ParamCopy from, cudaStream_t stream) {
  if (n == 0 || from == ParamCopy::kNone) return cudaSuccess;
  if (from == ParamCopy::kBf16) {
    WidenKernel<ParamCopy::kBf16><<<GridFor(n), kBlockThreads, 0, stream>>>(x, y, n);
  } else {
    WidenKernel<ParamCopy::kF16><<<GridFor(n), kBlockThreads, 0, stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCast(const float* x, uint16_t* y, size_t n, ParamCopy to, cudaStream_t stream) {
  if (n == 0 || to == ParamCopy::kNone) return cudaSuccess;
  const int phases[2] = {AlignedPhase(x, 4), AlignedPhase(y, 2)};
  const size_t periods[2] = {4, 8};
  size_t head = 0;
  const VectorSplit s = SplitFor(n, CommonHead(phases, periods, 2, &head), head);
  const unsigned grid = GridFor(s.vecs > 0 ? s.vecs : n);
  if (to == ParamCopy::kBf16) {
    CastKernel<ParamCopy::kBf16><<<grid, kBlockThreads, 0, stream>>>(x, y, n, s);
  } else {
    CastKernel<ParamCopy::kF16><<<grid, kBlockThreads, 0, stream>>>(x, y, n, s);
  }
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
