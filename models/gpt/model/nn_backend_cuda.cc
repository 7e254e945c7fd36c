// The CUDA back-end of the GPT (nn_backend.h): the kernels/cuda twins of models/gpt/nn/cpu/nn.h and cuBLASLt
// products, on one non-blocking stream of the calling thread's device. Built with STRATA_WITH_CUDA when
// cuBLASLt is found; the fused attention also needs cuDNN 9 (STRATA_GPT_CUDNN).
//
// Precision (NnOptions). Products run in fp32, TF32, or bf16: with bf16 each factor is rounded to bf16
// into a scratch buffer (kernels/cuda/cast.cuh, round to nearest even) and cuBLASLt multiplies with fp32
// accumulation into the fp32 activation or gradient, so the model's activations and the engine's
// gradients stay fp32. Bias gradients are summed from the fp32 output gradient.
//
// Note [Fused attention in the trainer]. The reference kernels (attention.cuh, fp32) save
// the probabilities [B,NH,T,T]. The fused path rounds qkv to bf16, runs cuDNN's SDPA (sdpa_cudnn.h) and
// widens its bf16 output; in `att` it saves cuDNN's row statistics [B,NH,T] (fp32) and, after them
// (256-byte aligned), the bf16 output the backward needs, so the per-layer memory is O(T) instead of
// O(T^2). The backward rounds qkv and dout again (the same bits) and widens cuDNN's dqkv.
//
// Errors. A launch or cuBLASLt failure is remembered (the first one) and returned by the next Sync(),
// naming the operation; later operations still run (on possibly bad data) until then, as on a CUDA stream.
#include <cuda_runtime.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/common/optimizer_arrays.h"
#include "kernels/cuda/add.cuh"
#include "kernels/cuda/cast.cuh"
#include "models/gpt/model/nn_backend.h"
#include "models/gpt/nn/cuda/attention.cuh"
#include "models/gpt/nn/cuda/cross_entropy.cuh"
#include "models/gpt/nn/cuda/embedding.cuh"
#include "models/gpt/nn/cuda/gelu.cuh"
#include "models/gpt/nn/cuda/layernorm.cuh"
#include "models/gpt/nn/cuda/matmul.h"
#include "models/gpt/nn/cuda/matmul_rate.cuh"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#if STRATA_GPT_CUDNN
#include "models/gpt/nn/cuda/sdpa_cudnn.h"
#endif

namespace strata::gpt {

namespace {

namespace kc = kernels::cuda;

template <typename T>
absl::StatusOr<std::shared_ptr<T>> DeviceArray(size_t n) {
  void* p = nullptr;
  const size_t bytes = (n == 0 ? 1 : n) * sizeof(T);
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc(", bytes, ") for GPT activations: ",
                                                     cudaGetErrorString(e)));
  }
  // On the legacy stream, which the back-end's non-blocking stream does not wait for: finish it here.
  cudaError_t z = cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy);
  if (z == cudaSuccess) z = cudaStreamSynchronize(cudaStreamLegacy);
  if (z != cudaSuccess) {
    cudaFree(p);
    return absl::InternalError(absl::StrCat("zeroing ", bytes, " bytes of GPT activations: ", cudaGetErrorString(z)));
  }
  return std::shared_ptr<T>(static_cast<T*>(p), [](T* q) { cudaFree(q); });
}

// A device buffer that only grows; growing waits for the stream (work in flight may still read it).
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
  ~Scratch() { cudaFree(p); }
  cudaError_t Ensure(size_t need, cudaStream_t stream) {
    if (need <= bytes) return cudaSuccess;
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) return e;
    p = nullptr;
    bytes = 0;
    e = cudaMalloc(&p, need);
    if (e == cudaSuccess) bytes = need;
    return e;
  }
};

// Buffers carved out of one allocation start 256-byte aligned.
size_t AlignUp(size_t bytes) { return RoundUp(bytes, 256); }

class CudaNn final : public NnBackend {
 public:
  CudaNn(cudaStream_t stream, void* workspace, std::unique_ptr<kc::MatmulContext> mm, const NnOptions& options)
      : stream_(stream), mm_workspace_(workspace), mm_(std::move(mm)), options_(options) {}
  ~CudaNn() override {
    cudaStreamSynchronize(stream_);
    mm_.reset();
#if STRATA_GPT_CUDNN
    sdpa_.reset();
#endif
    cudaFree(mm_workspace_);
    cudaFree(mean_loss_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  absl::StatusOr<std::shared_ptr<float>> AllocFloats(size_t n) override { return DeviceArray<float>(n); }
  absl::StatusOr<std::shared_ptr<int32_t>> AllocInts(size_t n) override { return DeviceArray<int32_t>(n); }
  void CopyIn(int32_t* dst, const int32_t* host, size_t n) override {
    Check(cudaMemcpyAsync(dst, host, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "copy tokens in");
    Check(cudaStreamSynchronize(stream_), "copy tokens in");  // `host` may be reused as soon as we return
  }
  absl::Status CopyOut(float* host, const float* src, size_t n) override {
    Check(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy out");
    return Sync();
  }
  void Zero(float* p, size_t n) override { Check(cudaMemsetAsync(p, 0, n * sizeof(float), stream_), "zero"); }
  void Widen(const uint16_t* src, DType dtype, float* dst, size_t n) override {
    const kernels::ParamCopy from = dtype == DType::kBF16 ? kernels::ParamCopy::kBf16 : kernels::ParamCopy::kF16;
    Check(kc::LaunchWiden(src, dst, n, from, stream_), "widen parameters");
  }

  // The factors of the products: fp32 as given, or rounded to bf16 into scratch slot `slot` (In), with
  // the fp32 fallback of Multiply.
  void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N) override {
    Multiply("matmul forward", M, K, N, [&](bool bf16) {
      return kc::MatmulForward(*mm_, In(bf16, 0, a, size_t(M) * K), In(bf16, 1, w, size_t(K) * N), bias, out, M, K, N,
                               false, TypesFor(bf16), stream_);
    });
  }
  void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias, int M,
                      int K, int N) override {
    LazyFactor d(this, 2, dout, size_t(M) * N);  // rounded at most once for both products
    if (da != nullptr) {
      Multiply("matmul dA", M, K, N, [&](bool bf16) {
        return kc::MatmulBackwardData(*mm_, d.Get(bf16), In(bf16, 1, w, size_t(K) * N), da, M, K, N,
                                      TypesFor(bf16), stream_);
      });
    }
    if (dw != nullptr) {
      Multiply("matmul dW", M, K, N, [&](bool bf16) {
        return kc::MatmulBackwardWeight(*mm_, d.Get(bf16), In(bf16, 0, a, size_t(M) * K), dw, nullptr, M, K, N,
                                        TypesFor(bf16), stream_);
      });
    }
    if (dbias != nullptr) Check(mm_->BiasGrad(dout, dbias, M, N, kc::kMatmulF32, stream_), "matmul dbias");
  }
  void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N) override {
    Multiply("lm head forward", M, K, N, [&](bool bf16) {
      return kc::MatmulTransBForward(*mm_, In(bf16, 0, a, size_t(M) * K), In(bf16, 1, b, size_t(N) * K), out, M, K, N,
                                     TypesFor(bf16), stream_);
    });
  }
  void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M, int K,
                            int N) override {
    LazyFactor d(this, 2, dout, size_t(M) * N);
    Multiply("lm head dA", M, K, N, [&](bool bf16) {
      return kc::MatmulTransBBackwardData(*mm_, d.Get(bf16), In(bf16, 1, b, size_t(N) * K), da, M, K, N,
                                          TypesFor(bf16), stream_);
    });
    Multiply("lm head dW", M, K, N, [&](bool bf16) {
      return kc::MatmulTransBBackwardWeight(*mm_, d.Get(bf16), In(bf16, 0, a, size_t(M) * K), db, M, K, N,
                                            TypesFor(bf16), stream_);
    });
  }
  void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                        int C) override {
    Check(kc::LaunchLayerNormForward(x, w, b, out, mean, rstd, N, C, 1e-5f, stream_), "layernorm forward");
  }
  void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int N, int C) override {
    if (!Check(ln_workspace_.Ensure(kc::LayerNormBackwardWorkspaceBytes(N, C), stream_), "layernorm workspace")) return;
    Check(kc::LaunchLayerNormBackward(dout, x, w, mean, rstd, dx, dw, db, N, C, static_cast<float*>(ln_workspace_.p),
                                      stream_),
          "layernorm backward");
  }
  void GeluForward(const float* x, float* out, size_t n) override {
    Check(kc::LaunchGeluForward(x, out, n, stream_), "gelu forward");
  }
  void GeluBackward(const float* x, const float* dout, float* dx, size_t n) override {
    Check(kc::LaunchGeluBackward(x, dout, dx, n, stream_), "gelu backward");
  }
  absl::StatusOr<AttentionBuffers> PrepareAttention(int B, int T, int C, int NH) override;
  const char* attention_in_use() const override { return any_fused_ ? "fused" : "reference"; }
  void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) override {
#if STRATA_GPT_CUDNN
    if (Fused(B, T, C, NH)) return FusedForward(qkv, out, att, B, T, C, NH);
#endif
    Check(kc::LaunchAttentionForward(qkv, out, att, B, T, C, NH, stream_), "attention forward");
  }
  void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt, int B,
                         int T, int C, int NH) override {
#if STRATA_GPT_CUDNN
    if (Fused(B, T, C, NH)) return FusedBackward(dout, qkv, att, dqkv, B, T, C, NH);
#endif
    Check(kc::LaunchAttentionBackward(dout, qkv, att, dqkv, datt, B, T, C, NH, stream_), "attention backward");
  }
  absl::StatusOr<double> CrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                             int N, int V) override {
    if (mean_loss_ == nullptr) Check(cudaMalloc(&mean_loss_, sizeof(double)), "loss scalar");
    Check(kc::LaunchCrossEntropyForward(logits, targets, probs, losses, N, V, static_cast<double*>(mean_loss_),
                                        stream_),
          "cross-entropy forward");
    double loss = 0;
    Check(cudaMemcpyAsync(&loss, mean_loss_, sizeof(double), cudaMemcpyDeviceToHost, stream_), "loss copy");
    absl::Status s = Sync();
    if (!s.ok()) return s;
    return loss;
  }
  void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N,
                            int V) override {
    Check(kc::LaunchCrossEntropyBackward(probs, targets, dlogits, dloss, N, V, stream_), "cross-entropy backward");
  }
  void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B, int T,
                        int C) override {
    Check(kc::LaunchEmbeddingForward(tokens, wte, wpe, out, B, T, C, stream_), "embedding forward");
  }
  void EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B, int T,
                         int C) override {
    Check(kc::LaunchEmbeddingBackward(dout, tokens, dwte, dwpe, B, T, C, stream_), "embedding backward");
  }
  void AddInto(float* dst, const float* src, size_t n) override {
    Check(kc::LaunchAddInto(dst, src, n, stream_), "residual add");
  }

  absl::StatusOr<double> Bf16MatmulFlops() override {
    double flops = 0;
    const kc::MatmulStatus s = kc::MeasureBf16MatmulFlops(*mm_, 4096, 4096, 4096, 20, stream_, &flops);
    if (!s.ok()) return absl::InternalError(absl::StrCat("bf16 matmul rate: ", s.message));
    return flops;
  }

  absl::Status Sync() override {
    Check(cudaStreamSynchronize(stream_), "synchronize");
    absl::Status s = std::move(first_);
    first_ = absl::OkStatus();
    return s;
  }

 private:
  static kc::MatmulTypes TypesFor(bool bf16) { return bf16 ? kc::kMatmulBf16InF32Out : kc::kMatmulF32; }
  // Runs `product(bf16)`: with bf16 factors when the products are bf16, else in fp32. Where cuBLASLt has
  // no bf16 algorithm for a shape (a row length that is not a multiple of 8 leaves bf16 rows without
  // 16-byte alignment, as GPT-2's 50257-token vocabulary does in the head), that product runs in fp32
  // instead, logged once per kind of product; later calls of that shape go to fp32 at once, without
  // rounding factors that would not be used.
  template <typename Product>
  void Multiply(const char* what, int M, int K, int N, Product&& product) {
    const auto shape = std::make_tuple(std::string(what), M, K, N);
    if (options_.products != Products::kBf16 || fp32_shapes_.count(shape) != 0) {
      Check(product(false), what);
      return;
    }
    kc::MatmulStatus s = product(true);
    if (s.code == kc::MatmulCode::kUnsupported) {
      fp32_shapes_.insert(shape);
      if (fp32_logged_.insert(what).second) {
        STRATA_LOG(Info) << "GPT on CUDA, " << what << ": no bf16 algorithm for this shape (" << s.message
                         << "); this product runs in fp32";
      }
      s = product(false);
    }
    Check(s, what);
  }
  // A factor rounded to bf16 (Factor) on first use, and reused: the output gradient both products of a
  // backward read.
  class LazyFactor {
   public:
    LazyFactor(CudaNn* nn, int slot, const float* x, size_t n) : nn_(nn), slot_(slot), x_(x), n_(n) {}
    const void* Get(bool bf16) {
      if (!bf16) return x_;
      if (rounded_ == nullptr) rounded_ = nn_->Factor(slot_, x_, n_);
      return rounded_;
    }

   private:
    CudaNn* nn_;
    int slot_;
    const float* x_;
    size_t n_;
    const void* rounded_ = nullptr;
  };
  // `x` for fp32 factors, else Factor.
  const void* In(bool bf16, int slot, const float* x, size_t n) { return bf16 ? Factor(slot, x, n) : x; }
  // `x` itself for fp32 products; with bf16 products, x rounded to bf16 in scratch slot `slot` (0: the
  // activation factor, 1: the weight, 2: the output gradient), valid until the slot is used again.
  const void* Factor(int slot, const float* x, size_t n) {
    if (options_.products != Products::kBf16) return x;
    uint16_t* y = Bf16Scratch(slot, n);
    if (y != nullptr) Check(kc::LaunchCast(x, y, n, kernels::ParamCopy::kBf16, stream_), "round a factor to bf16");
    return y;
  }
  uint16_t* Bf16Scratch(int slot, size_t n) {
    return Check(scratch_[slot].Ensure(AlignUp(n * 2), stream_), "bf16 scratch")
               ? static_cast<uint16_t*>(scratch_[slot].p)
               : nullptr;
  }
#if STRATA_GPT_CUDNN
  using ShapeKey = std::tuple<int, int, int, int>;
  bool Fused(int B, int T, int C, int NH) const {
    auto it = fused_.find(ShapeKey{B, T, C, NH});
    return it != fused_.end() && it->second;
  }
  // Why cuDNN cannot run this shape (building both plans), or OK; sizes the workspace.
  absl::Status PrepareFused(const kc::SdpaShape& shape);
  void FusedForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH);
  void FusedBackward(const float* dout, const float* qkv, const float* att, float* dqkv, int B, int T, int C, int NH);
  static size_t StatsBytes(int B, int T, int NH) { return FusedAttentionStatsBytes(B, T, NH); }
  std::unique_ptr<kc::SdpaContext> sdpa_;
  Scratch sdpa_workspace_;
  std::map<ShapeKey, bool> fused_;  // PrepareAttention's choice per shape
#endif
  bool any_fused_ = false;  // some shape runs the fused attention

  // Remembers the first failure; true when `e` is success.
  bool Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (first_.ok()) first_ = absl::InternalError(absl::StrCat("GPT on CUDA, ", what, ": ", cudaGetErrorString(e)));
    return false;
  }
  // A cuBLASLt or cuDNN status (kc::MatmulStatus, kc::SdpaStatus): the same fields.
  template <typename LibraryStatus>
  bool Check(const LibraryStatus& s, const char* what) {
    if (s.ok()) return true;
    if (first_.ok()) first_ = absl::InternalError(absl::StrCat("GPT on CUDA, ", what, ": ", s.message));
    return false;
  }

  cudaStream_t stream_;
  void* mm_workspace_;
  std::unique_ptr<kc::MatmulContext> mm_;
  Scratch ln_workspace_;
  void* mean_loss_ = nullptr;
  NnOptions options_;
  Scratch scratch_[3];  // bf16 factors (Factor); the fused attention reuses them for qkv, dout and dqkv / out
  std::set<std::tuple<std::string, int, int, int>> fp32_shapes_;  // Multiply: no bf16 algorithm
  std::set<std::string> fp32_logged_;                              // Multiply: logged once per product
  absl::Status first_;
};

absl::StatusOr<AttentionBuffers> CudaNn::PrepareAttention(int B, int T, int C, int NH) {
  const bool want = options_.attention == AttentionKind::kFused ||
                    (options_.attention == AttentionKind::kAuto && options_.products == Products::kBf16);
  if (!want) return NnBackend::PrepareAttention(B, T, C, NH);
#if STRATA_GPT_CUDNN
  const ShapeKey key{B, T, C, NH};
  auto it = fused_.find(key);
  if (it == fused_.end()) {
    absl::Status why = PrepareFused(kc::SdpaShape{B, T, C, NH});
    if (!why.ok() && options_.attention == AttentionKind::kFused) {
      return Annotate(why, absl::StrCat("--attention fused (B=", B, " T=", T, " C=", C, " heads=", NH, ")"));
    }
    if (!why.ok()) {
      STRATA_LOG(Info) << "attention: the reference kernel for B=" << B << " T=" << T << " C=" << C << " heads=" << NH
                       << " (cuDNN's fused attention cannot run it: " << why.message() << ")";
    }
    it = fused_.emplace(key, why.ok()).first;
    any_fused_ = any_fused_ || why.ok();
  }
  if (!it->second) return NnBackend::PrepareAttention(B, T, C, NH);
  // The row statistics, then (256-byte aligned) the bf16 output (Note [Fused attention in the trainer]).
  return FusedAttentionBuffers(B, T, C, NH);
#else
  if (options_.attention == AttentionKind::kFused) {
    return absl::UnimplementedError("--attention fused: this build has no cuDNN 9 (strata_gpt_cudnn)");
  }
  return NnBackend::PrepareAttention(B, T, C, NH);
#endif
}

#if STRATA_GPT_CUDNN
absl::Status CudaNn::PrepareFused(const kc::SdpaShape& shape) {
  auto fail = [](const kc::SdpaStatus& s) { return absl::FailedPreconditionError(s.message); };
  if (sdpa_ == nullptr) {
    const kc::SdpaStatus s = kc::SdpaContext::Create(&sdpa_);
    if (!s.ok()) return fail(s);
  }
  size_t need = 0;
  for (kc::SdpaPass pass : {kc::SdpaPass::kForward, kc::SdpaPass::kBackward}) {
    kc::SdpaStatus s = kc::SdpaSupported(*sdpa_, shape, kc::SdpaDtype::kBf16, pass);
    size_t bytes = 0;
    if (s.ok()) s = kc::SdpaWorkspaceBytes(*sdpa_, shape, kc::SdpaDtype::kBf16, pass, &bytes);
    if (!s.ok()) return fail(s);
    need = std::max(need, bytes);
  }
  const cudaError_t e = sdpa_workspace_.Ensure(AlignUp(std::max<size_t>(need, 1)), stream_);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("the fused attention's workspace (", need, " bytes): ",
                                                     cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

void CudaNn::FusedForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) {
  const size_t n = size_t(B) * T * C;
  uint16_t* qkv16 = Bf16Scratch(0, 3 * n);
  if (qkv16 == nullptr) return;
  Check(kc::LaunchCast(qkv, qkv16, 3 * n, kernels::ParamCopy::kBf16, stream_), "round qkv to bf16");
  float* stats = att;
  uint16_t* out16 = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(att) + StatsBytes(B, T, NH));
  if (!Check(kc::SdpaForward(*sdpa_, kc::SdpaDtype::kBf16, kc::SdpaShape{B, T, C, NH}, qkv16, out16, stats, stream_,
                             kc::SdpaWorkspace{sdpa_workspace_.p, sdpa_workspace_.bytes}),
             "fused attention forward")) {
    return;
  }
  Check(kc::LaunchWiden(out16, out, n, kernels::ParamCopy::kBf16, stream_), "widen the attention output");
}

void CudaNn::FusedBackward(const float* dout, const float* qkv, const float* att, float* dqkv, int B, int T, int C,
                           int NH) {
  const size_t n = size_t(B) * T * C;
  uint16_t* qkv16 = Bf16Scratch(0, 3 * n);
  uint16_t* dout16 = Bf16Scratch(2, n);
  uint16_t* dqkv16 = Bf16Scratch(1, 3 * n);
  if (qkv16 == nullptr || dout16 == nullptr || dqkv16 == nullptr) return;
  Check(kc::LaunchCast(qkv, qkv16, 3 * n, kernels::ParamCopy::kBf16, stream_), "round qkv to bf16");
  Check(kc::LaunchCast(dout, dout16, n, kernels::ParamCopy::kBf16, stream_), "round the attention gradient to bf16");
  const float* stats = att;
  const uint16_t* out16 = reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(att) + StatsBytes(B, T, NH));
  if (!Check(kc::SdpaBackward(*sdpa_, kc::SdpaDtype::kBf16, kc::SdpaShape{B, T, C, NH}, dout16, qkv16, out16, stats,
                              dqkv16, stream_, kc::SdpaWorkspace{sdpa_workspace_.p, sdpa_workspace_.bytes}),
             "fused attention backward")) {
    return;
  }
  Check(kc::LaunchWiden(dqkv16, dqkv, 3 * n, kernels::ParamCopy::kBf16, stream_), "widen the qkv gradient");
}
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<NnBackend>> MakeCudaNn(const NnOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError("--device cuda: no CUDA device is visible to this process");
  }
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  void* workspace = nullptr;
  e = cudaMalloc(&workspace, kc::kMatmulRecommendedWorkspaceBytes);
  if (e != cudaSuccess) {
    cudaStreamDestroy(stream);
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of the cuBLASLt workspace: ", cudaGetErrorString(e)));
  }
  kc::MatmulOptions o;
  o.allow_tf32 = options.products == Products::kTf32;
  std::unique_ptr<kc::MatmulContext> mm;
  const kc::MatmulStatus s = kc::MatmulContext::Create(workspace, kc::kMatmulRecommendedWorkspaceBytes, o, &mm);
  if (!s.ok()) {
    cudaFree(workspace);
    cudaStreamDestroy(stream);
    return absl::InternalError(absl::StrCat("cuBLASLt: ", s.message));
  }
  return std::unique_ptr<NnBackend>(new CudaNn(stream, workspace, std::move(mm), options));
}

}  // namespace strata::gpt
