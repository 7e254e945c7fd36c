// NnBackend: where the GPT's forward and backward run. The host back-end calls models/gpt/nn/cpu/nn.h (what
// the trainer always ran, unchanged); the CUDA back-end (nn_backend_cuda.cc, CUDA builds) runs the
// kernels/cuda twins and cuBLASLt on one stream of the engine's GPU.
//
// Contract. Every operation has the semantics of the models/gpt/nn/cpu/nn.h function of the same name (shapes,
// accumulate-or-write, aliasing). Pointers are the back-end's memory: activations from Alloc*, the
// engine's parameter and gradient views (device memory with a CUDA engine). Operations are enqueued in
// order; Sync() waits for all of them and returns the first error since the previous Sync (a CUDA
// launch or cuBLASLt failure), so a caller checks once per unit instead of per call. The host back-end
// runs each call to completion and never fails. One thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/base/dtype.h"

namespace strata::gpt {

// How a back-end computes. The host back-end runs fp32 products and the reference attention only.
enum class Products : uint8_t {
  kF32,   // fp32 factors, fp32 accumulation
  kTf32,  // fp32 factors rounded to TF32 on the tensor cores (~1e-3 relative error)
  kBf16,  // activations and weights rounded to bf16 on the way in, fp32 accumulation, fp32 results
};
enum class AttentionKind : uint8_t {
  kAuto,       // fused where the products are bf16 and cuDNN takes the shape, else the reference
  kFused,      // cuDNN's fused SDPA on bf16 q, k, v (an error where it cannot run)
  kReference,  // the plain kernel, fp32, saving the T x T probabilities
};
struct NnOptions {
  Products products = Products::kF32;
  AttentionKind attention = AttentionKind::kAuto;
};
// Parses "fp32" / "tf32" / "bf16" and "auto" / "fused" / "reference"; the error names the flag.
absl::StatusOr<Products> ParseProducts(const std::string& s);
absl::StatusOr<AttentionKind> ParseAttention(const std::string& s);
const char* ProductsName(Products p);

// What one attention call keeps for its backward (AttentionForward's `att`) and the scratch its backward
// needs (AttentionBackward's `datt`), in floats.
struct AttentionBuffers {
  size_t saved_floats = 0;
  size_t scratch_floats = 0;
  bool fused = false;
};

// The buffers of the reference attention (the probabilities [B,NH,T,T], as much scratch) and of the fused
// one (cuDNN: the row statistics, then 256-byte aligned, the bf16 output), for PrepareAttention and for
// `strata plan`, which sizes a micro-batch without a back-end.
AttentionBuffers ReferenceAttentionBuffers(int B, int T, int NH);
size_t FusedAttentionStatsBytes(int B, int T, int NH);
AttentionBuffers FusedAttentionBuffers(int B, int T, int C, int NH);

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
  // Chooses the attention for a (B, T, C, NH) shape before its buffers are allocated, and says how large
  // they must be. The reference saves the probabilities [B,NH,T,T] and needs as much scratch; a fused
  // attention saves less (cuDNN: the row statistics and its bf16 output). Called again for a shape it
  // has seen, it returns the same answer.
  virtual absl::StatusOr<AttentionBuffers> PrepareAttention(int B, int T, int C, int NH) {
    (void)C;
    return ReferenceAttentionBuffers(B, T, NH);
  }
  // "fused" once PrepareAttention chose the fused attention for some shape, else "reference".
  virtual const char* attention_in_use() const { return "reference"; }
  // `att` and `datt` are PrepareAttention's buffers for this shape.
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

// CUDA builds (nn_backend_cuda.cc): on the calling thread's current device, computing as `options` say
// (fused attention needs a build with cuDNN 9; kFused is an error without it, kAuto falls back to the
// reference). Unimplemented elsewhere.
absl::StatusOr<std::unique_ptr<NnBackend>> MakeCudaNn(const NnOptions& options);

}  // namespace strata::gpt
