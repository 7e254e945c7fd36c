// The matrix products of the GPT trainer on cuBLASLt: the device twins of models/gpt/nn/cpu/nn.h's
// MatmulForward / MatmulBackward / MatmulTransBForward / MatmulTransBBackward, row-major, with the same
// accumulate contract (activation gradients written, parameter gradients accumulated), in fp32 or bf16
// with fp32 accumulation (CUBLAS_COMPUTE_32F). Element types per call (MatmulTypes, matmul_plan.h):
// factors and destination (f32, f32), (bf16, f32) or (bf16, bf16); bias / dbias f32 or bf16 in each. So
// a bf16 layer can write fp32 activations, and its bf16 backward can accumulate fp32 weight gradients.
// fp32 products do not use TF32 unless MatmulOptions::allow_tf32 says so.
//
// A MatmulContext owns the cuBLASLt handle and a cache of plans (descriptors, layouts and the
// heuristic's algorithm) keyed by MatmulKey, so a repeated product runs the heuristic once. Its workspace
// is the caller's device buffer (Create). Errors come back as MatmulStatus naming the failing call,
// file:line and cuBLASLt's / CUDA's text; nothing here throws, aborts or uses Abseil (a kernels/ leaf).
//
// Streams and threads: every product is enqueued on the caller's `stream` without host synchronisation
// (the heuristic is a host-side query). A context is used by one thread at a time, and its workspace is
// shared by every product it runs: products of one context on different streams must be ordered by the
// caller (events), or each stream gets its own context. Operand buffers must stay valid until the work
// completes on `stream`. Outputs must not overlap inputs. M, K, N may be 0 (nn.h's empty-product rules:
// a written output of an empty sum is zeros, an accumulated one is unchanged).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "models/gpt/nn/cuda/matmul_plan.h"

namespace strata::kernels::cuda {

enum class MatmulCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad shape, null pointer, unsupported type combination
  kUnsupported,      // cuBLASLt has no algorithm for this product
  kCublasError,      // a cuBLASLt call failed (foreign_code: cublasStatus_t)
  kCudaError,        // a CUDA runtime call or kernel launch failed (foreign_code: cudaError_t)
};

struct MatmulStatus {
  MatmulCode code = MatmulCode::kOk;
  int foreign_code = 0;  // the cublasStatus_t / cudaError_t value, 0 otherwise
  std::string message;   // empty when ok
  bool ok() const { return code == MatmulCode::kOk; }
};

struct MatmulOptions {
  // fp32 products may round their factors to TF32 on the tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32):
  // ~8x faster, but ~1e-3 relative error, so off by default and results stay close to the host's.
  bool allow_tf32 = false;
  size_t plan_cache_capacity = 64;  // distinct products kept (least recently used evicted)
};

// cuBLASLt's recommended workspace on Hopper (32 MiB); 4 MiB suffices on Ampere.
inline constexpr size_t kMatmulRecommendedWorkspaceBytes = size_t{32} << 20;

class MatmulContext {
 public:
  // Creates the cuBLASLt handle on the current device (the context serves that device only). `workspace` (device
  // memory, 256-byte aligned, or nullptr with 0 bytes) is lent for the context's lifetime: cuBLASLt's scratch and the
  // bias gradient's partial sums. Larger workspaces let cuBLASLt choose split-K algorithms; any size (0 included)
  // works.
  static MatmulStatus Create(void* workspace, size_t workspace_bytes, const MatmulOptions& options,
                             std::unique_ptr<MatmulContext>* out);
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;

  // The general row-major product C[m,n] = op(X) @ op(Y) (+ beta C) (+ bias[n] on every row; bias may be
  // nullptr), beta 0 or 1 (0: C is written, never read). The six products below are instances of it.
  MatmulStatus Gemm(const RowMajorProduct& p, const void* bias, const MatmulTypes& types, cudaStream_t stream);

  // dbias[n] += column sums of dout[m,n] (types.in: dout's type, types.bias: dbias's), deterministic
  // (Note [Deterministic bias gradient]), partial sums in the context's workspace.
  MatmulStatus BiasGrad(const void* dout, void* dbias, int M, int N, const MatmulTypes& types, cudaStream_t stream);

  // How many times the cuBLASLt heuristic has run (a cache miss each), and the plans now cached.
  uint64_t heuristic_calls() const;
  size_t cached_plans() const;

 private:
  struct Impl;
  explicit MatmulContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// out[M,N] = a[M,K] @ w[K,N] (+ bias[N] when bias != nullptr); accumulate = true adds into out.
MatmulStatus MatmulForward(MatmulContext& ctx, const void* a, const void* w, const void* bias, void* out, int M, int K,
                           int N, bool accumulate, const MatmulTypes& types, cudaStream_t stream);
// Given dout[M,N] of out = a @ w + bias: da[M,K] = dout @ w^T (written).
MatmulStatus MatmulBackwardData(MatmulContext& ctx, const void* dout, const void* w, void* da, int M, int K, int N,
                                const MatmulTypes& types, cudaStream_t stream);
// dw[K,N] += a^T @ dout; dbias[N] += column sums of dout (skipped when dbias == nullptr; deterministic,
// Note [Deterministic bias gradient]; types.bias is dbias's type).
MatmulStatus MatmulBackwardWeight(MatmulContext& ctx, const void* dout, const void* a, void* dw, void* dbias, int M,
                                  int K, int N, const MatmulTypes& types, cudaStream_t stream);
// out[M,N] = a[M,K] @ b[N,K]^T (the tied LM head).
MatmulStatus MatmulTransBForward(MatmulContext& ctx, const void* a, const void* b, void* out, int M, int K, int N,
                                 const MatmulTypes& types, cudaStream_t stream);
// Given dout[M,N] of out = a @ b^T: da[M,K] = dout @ b (written).
MatmulStatus MatmulTransBBackwardData(MatmulContext& ctx, const void* dout, const void* b, void* da, int M, int K,
                                      int N, const MatmulTypes& types, cudaStream_t stream);
// db[N,K] += dout^T @ a.
MatmulStatus MatmulTransBBackwardWeight(MatmulContext& ctx, const void* dout, const void* a, void* db, int M, int K,
                                        int N, const MatmulTypes& types, cudaStream_t stream);

}  // namespace strata::kernels::cuda
