// Bias kernels of the cuBLASLt products (see matmul_bias.cuh).
#include "kernels/common/element_math.h"
#include "kernels/cuda/launch_util.cuh"
#include "models/gpt/nn/cuda/matmul_bias.cuh"

namespace strata::kernels::cuda {
namespace {

// fp32 elements are float, bf16 elements their uint16_t bits.
__device__ __forceinline__ float LoadElem(const float* p) { return *p; }
__device__ __forceinline__ float LoadElem(const uint16_t* p) { return Bf16ToFloat(*p); }
__device__ __forceinline__ void StoreElem(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreElem(uint16_t* p, float v) { *p = FloatToBf16(v); }

// Calls f(T{}) with T the storage type of `t`.
template <class F>
void WithElemType(MatmulDtype t, F&& f) {
  if (t == MatmulDtype::kF32) {
    f(float{});
  } else {
    f(uint16_t{});
  }
}

template <class TOut, class TBias>
__global__ void AddBiasRowsKernel(TOut* out, const TBias* bias, size_t total, size_t N, size_t ld_out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const size_t col = i % N;
    TOut* o = out + (i / N) * ld_out + col;
    StoreElem(o, LoadElem(o) + LoadElem(bias + col));
  }
}

// Bias gradient, pass 1: block (x, y) takes kColsPerBlock columns of row chunk y. Thread (c, l) sums rows
// l, l + kRowLanes, ... of the chunk in order (a warp reads 32 adjacent columns of one row), then lane 0 of
// each column adds the kRowLanes sums in order. The chunk's sums go to partial[y][col], or, with a single
// chunk (partial == nullptr), straight into dbias.
constexpr int kColsPerBlock = 32;
constexpr int kRowLanes = 8;

template <class TIn, class TBias>
__global__ void BiasGradChunkKernel(const TIn* dout, int64_t M, int64_t N, int64_t rows_per_chunk, float* partial,
                                    TBias* dbias) {
  __shared__ float lane_sums[kRowLanes][kColsPerBlock];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t row1 = min(M, row0 + rows_per_chunk);
  float acc = 0.0f;
  if (col < N) {
    for (int64_t r = row0 + threadIdx.y; r < row1; r += kRowLanes) acc += LoadElem(dout + r * N + col);
  }
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= N) return;
  float sum = 0.0f;
  for (int l = 0; l < kRowLanes; ++l) sum += lane_sums[l][threadIdx.x];
  if (partial != nullptr) {
    partial[static_cast<int64_t>(blockIdx.y) * N + col] = sum;
  } else {
    StoreElem(dbias + col, LoadElem(dbias + col) + sum);
  }
}

// Pass 2: dbias[col] += the chunks' partial sums, added in chunk order.
template <class TBias>
__global__ void BiasGradFinishKernel(const float* partial, int64_t chunks, int64_t N, TBias* dbias) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float sum = 0.0f;
  for (int64_t y = 0; y < chunks; ++y) sum += partial[y * N + col];
  StoreElem(dbias + col, LoadElem(dbias + col) + sum);
}

}  // namespace

cudaError_t LaunchAddBiasRows(void* out, MatmulDtype out_type, const void* bias, MatmulDtype bias_type, int64_t M,
                              int64_t N, int64_t ld_out, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const size_t total = static_cast<size_t>(M) * static_cast<size_t>(N);
  WithElemType(out_type, [&](auto out_tag) {
    using TOut = decltype(out_tag);
    WithElemType(bias_type, [&](auto bias_tag) {
      using TBias = decltype(bias_tag);
      AddBiasRowsKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(
          static_cast<TOut*>(out), static_cast<const TBias*>(bias), total, static_cast<size_t>(N),
          static_cast<size_t>(ld_out));
    });
  });
  return cudaGetLastError();
}

cudaError_t LaunchBiasGrad(const void* dout, MatmulDtype dout_type, void* dbias, MatmulDtype dbias_type, int64_t M,
                           int64_t N, float* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const int64_t chunks = BiasGradChunks(M, N, workspace_bytes);
  const int64_t rows_per_chunk = BiasGradRowsPerChunk(M, chunks);
  float* partial = chunks > 1 ? workspace : nullptr;
  const dim3 grid(BlocksFor(static_cast<size_t>(N), kColsPerBlock), static_cast<unsigned>(chunks));
  const dim3 block(kColsPerBlock, kRowLanes);
  cudaError_t err = cudaSuccess;
  WithElemType(dout_type, [&](auto in_tag) {
    using TIn = decltype(in_tag);
    WithElemType(dbias_type, [&](auto bias_tag) {
      using TBias = decltype(bias_tag);
      TBias* db = static_cast<TBias*>(dbias);
      BiasGradChunkKernel<<<grid, block, 0, stream>>>(static_cast<const TIn*>(dout), M, N, rows_per_chunk, partial, db);
      err = cudaGetLastError();
      if (err != cudaSuccess || partial == nullptr) return;
      BiasGradFinishKernel<<<BlocksFor(static_cast<size_t>(N), kBlockThreads), kBlockThreads, 0, stream>>>(
          partial, chunks, N, db);
      err = cudaGetLastError();
    });
  });
  return err;
}

}  // namespace strata::kernels::cuda
