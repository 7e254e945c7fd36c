// Embedding kernels (see embedding.cuh).
#include "models/gpt/nn/cuda/embedding.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace strata::kernels::cuda {
namespace {

// One block per row (b, t), threads along the channels.
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* wte, const float* wpe, float* out, int N,
                                       int T, int C) {
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float* e = wte + static_cast<size_t>(tokens[row]) * C;
    const float* p = wpe + static_cast<size_t>(row % T) * C;
    float* o = out + static_cast<size_t>(row) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = e[c] + p[c];
  }
}

// Note [Deterministic embedding backward]: blockIdx.y is the vocabulary bucket, x spans the channels.
__global__ void EmbeddingBackwardWteKernel(const float* dout, const int32_t* tokens, float* dwte, int N, int C) {
  __shared__ int32_t tile[kBlockThreads];
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int bucket = blockIdx.y;
  for (int base = 0; base < N; base += kBlockThreads) {
    const int count = min(kBlockThreads, N - base);
    __syncthreads();  // every thread is done with the previous tile
    if (static_cast<int>(threadIdx.x) < count) tile[threadIdx.x] = tokens[base + threadIdx.x];
    __syncthreads();
    if (c >= C) continue;  // still takes part in the barriers above
    for (int k = 0; k < count; ++k) {
      const int32_t tok = tile[k];
      if (tok % kEmbeddingBuckets != bucket) continue;
      dwte[static_cast<size_t>(tok) * C + c] += dout[static_cast<size_t>(base + k) * C + c];
    }
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in order, one thread per (t, c).
__global__ void EmbeddingBackwardWpeKernel(const float* dout, float* dwpe, int B, int T, int C) {
  const size_t n = static_cast<size_t>(T) * C;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[static_cast<size_t>(b) * n + i];
    dwpe[i] = acc;
  }
}

}  // namespace

cudaError_t LaunchEmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B,
                                   int T, int C, cudaStream_t stream) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return cudaSuccess;
  EmbeddingForwardKernel<<<GridForRows(N), kBlockThreads, 0, stream>>>(tokens, wte, wpe, out, N, T, C);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B,
                                    int T, int C, cudaStream_t stream) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return cudaSuccess;
  const dim3 grid(BlocksFor(static_cast<size_t>(C), kBlockThreads), kEmbeddingBuckets);
  EmbeddingBackwardWteKernel<<<grid, kBlockThreads, 0, stream>>>(dout, tokens, dwte, N, C);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  EmbeddingBackwardWpeKernel<<<GridFor(static_cast<size_t>(T) * C), kBlockThreads, 0, stream>>>(dout, dwpe, B, T, C);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
