// The bf16 matrix-product rate probe (see matmul_rate.cuh).
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/element_math.h"
#include "kernels/cuda/launch_util.cuh"
#include "models/gpt/nn/cuda/matmul_internal.h"
#include "models/gpt/nn/cuda/matmul_rate.cuh"

namespace strata::kernels::cuda {
namespace {

// p[i] = bf16 of a hash of (i, seed) mapped to [-1, 1): cheap, deterministic, no host copy.
__global__ void FillPseudoRandomBf16Kernel(uint16_t* p, size_t n, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    p[i] = FloatToBf16(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Owners of the probe's device buffers and events (released when the probe returns).
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() { cudaFree(ptr); }
};
struct TimingEvent {
  cudaEvent_t event = nullptr;
  ~TimingEvent() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

}  // namespace

MatmulStatus MeasureBf16MatmulFlops(MatmulContext& ctx, int M, int N, int K, int iters, cudaStream_t stream,
                                    double* flops_per_s) {
  if (M <= 0 || N <= 0 || K <= 0 || iters <= 0 || flops_per_s == nullptr) {
    return internal::MatmulFailure(MatmulCode::kInvalidArgument, 0,
                                   "MeasureBf16MatmulFlops: M, N, K and iters must be positive, flops_per_s non-null");
  }
  const size_t a_elems = static_cast<size_t>(M) * K, w_elems = static_cast<size_t>(K) * N;
  DeviceBuffer a, w, out;
  STRATA_MM_CUDA_CALL(cudaMalloc(&a.ptr, a_elems * sizeof(uint16_t)));
  STRATA_MM_CUDA_CALL(cudaMalloc(&w.ptr, w_elems * sizeof(uint16_t)));
  STRATA_MM_CUDA_CALL(cudaMalloc(&out.ptr, static_cast<size_t>(M) * N * sizeof(uint16_t)));
  FillPseudoRandomBf16Kernel<<<GridFor(a_elems), kBlockThreads, 0, stream>>>(static_cast<uint16_t*>(a.ptr), a_elems,
                                                                             1u);
  FillPseudoRandomBf16Kernel<<<GridFor(w_elems), kBlockThreads, 0, stream>>>(static_cast<uint16_t*>(w.ptr), w_elems,
                                                                             2u);
  STRATA_MM_CUDA_CALL(cudaGetLastError());
  const auto product = [&]() {
    return MatmulForward(ctx, a.ptr, w.ptr, nullptr, out.ptr, M, K, N, /*accumulate=*/false, kMatmulBf16, stream);
  };
  for (int i = 0; i < 2; ++i) STRATA_MM_RETURN_IF_ERROR(product());  // warm-up; the first builds the plan
  TimingEvent start, stop;
  STRATA_MM_CUDA_CALL(cudaEventCreate(&start.event));
  STRATA_MM_CUDA_CALL(cudaEventCreate(&stop.event));
  STRATA_MM_CUDA_CALL(cudaEventRecord(start.event, stream));
  for (int i = 0; i < iters; ++i) STRATA_MM_RETURN_IF_ERROR(product());
  STRATA_MM_CUDA_CALL(cudaEventRecord(stop.event, stream));
  STRATA_MM_CUDA_CALL(cudaEventSynchronize(stop.event));  // the measurement's one host wait
  float ms = 0.0f;
  STRATA_MM_CUDA_CALL(cudaEventElapsedTime(&ms, start.event, stop.event));
  if (!(ms > 0.0f)) {
    return internal::MatmulFailure(MatmulCode::kCudaError, 0,
                                   "MeasureBf16MatmulFlops: elapsed time " + std::to_string(ms) + " ms");
  }
  *flops_per_s = 2.0 * M * N * static_cast<double>(K) * iters / (static_cast<double>(ms) * 1e-3);
  return {};
}

}  // namespace strata::kernels::cuda
