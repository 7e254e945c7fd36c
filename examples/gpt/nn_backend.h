// NnBackend: where the GPT's forward and backward run. The host back-end calls kernels/cpu/nn.h (what
// the trainer always ran, unchanged); the CUDA back-end (nn_backend_cuda.cc, CUDA builds) runs the
// kernels/cuda twins and cuBLASLt on one stream of the engine's GPU.
//
// Contract. Every operation has the semantics of the kernels/cpu/nn.h function of the same name (shapes,
// accumulate-or-write, aliasing). Pointers are the back-end's memory: activations from Alloc*, the
// engine's parameter and gradient views (device memory with a CUDA engine). Operations are enqueued in
// order; Sync() waits for all of them and returns the first error since the previous Sync (a CUDA
// launch or cuBLASLt failure), so a caller checks once per unit instead of per call. The host back-end
// runs each call to completion and never fails. One thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/base/dtype.h"

namespace strata::gpt {

class NnBackend {
 public:
  virtual ~NnBackend() = default;
  virtual const char* name() const = 0;  // "host" or "cuda"

  // Zeroed memory of the back-end, freed when the returned pointer is.
  virtual absl::StatusOr<std::shared_ptr<float>> AllocFloats(size_t n) = 0;
  virtual absl::StatusOr<std::shared_ptr<int32_t>> AllocInts(size_t n) = 0;
  virtual void CopyIn(int32_t* dst, const int32_t* host, size_t n) = 0;  // host -> back-end memory
  virtual absl::Status CopyOut(float* host, const float* src, size_t n) = 0;  // blocking
  virtual void Zero(float* p, size_t n) = 0;
  // dst[i] = src[i] widened from bf16 / fp16 bits (the engine's low-precision parameters).
  virtual void Widen(const uint16_t* src, DType dtype, float* dst, size_t n) = 0;

  virtual void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N) = 0;
  virtual void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias,
                              int M, int K, int N) = 0;
  virtual void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N) = 0;
  virtual void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M,
                                    int K, int N) = 0;
  virtual void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd,
                                int N, int C) = 0;
  virtual void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean,
                                 const float* rstd, float* dx, float* dw, float* db, int N, int C) = 0;
  virtual void GeluForward(const float* x, float* out, size_t n) = 0;
  virtual void GeluBackward(const float* x, const float* dout, float* dx, size_t n) = 0;
  virtual void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) = 0;
  virtual void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt,
                                 int B, int T, int C, int NH) = 0;
  // The mean loss (blocking: it synchronises), NaN for a target outside [0, V).
  virtual absl::StatusOr<double> CrossEntropyForward(const float* logits, const int32_t* targets, float* probs,
                                                     float* losses, int N, int V) = 0;
  virtual void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N,
                                    int V) = 0;
  virtual void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B, int T,
                                int C) = 0;
  virtual void EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B, int T,
                                 int C) = 0;
  virtual void AddInto(float* dst, const float* src, size_t n) = 0;

  virtual absl::Status Sync() = 0;

  // The dense bf16 matrix-product rate of this back-end in FLOP/s (4096^3 products, measured now): the
  // reference of an MFU figure. Unimplemented on the host.
  virtual absl::StatusOr<double> Bf16MatmulFlops() {
    return absl::UnimplementedError("no bf16 matrix products on this back-end");
  }
};

std::unique_ptr<NnBackend> MakeHostNn();

// CUDA builds (nn_backend_cuda.cc): on the calling thread's current device. `allow_tf32` lets the fp32
// matrix products use TF32 tensor cores (faster, ~1e-3 relative error). Unimplemented elsewhere.
absl::StatusOr<std::unique_ptr<NnBackend>> MakeCudaNn(bool allow_tf32);

}  // namespace strata::gpt
