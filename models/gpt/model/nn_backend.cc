#include "models/gpt/model/nn_backend.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "models/gpt/nn/cpu/nn.h"

namespace strata::gpt {

namespace {

namespace nn = kernels::cpu;

template <typename T>
std::shared_ptr<T> HostArray(size_t n) {
  return std::shared_ptr<T>(new T[n == 0 ? 1 : n](), std::default_delete<T[]>());
}

class HostNn final : public NnBackend {
 public:
  const char* name() const override { return "host"; }
  absl::StatusOr<std::shared_ptr<float>> AllocFloats(size_t n) override { return HostArray<float>(n); }
  absl::StatusOr<std::shared_ptr<int32_t>> AllocInts(size_t n) override { return HostArray<int32_t>(n); }
  void CopyIn(int32_t* dst, const int32_t* host, size_t n) override {
    if (n != 0 && dst != host) std::memcpy(dst, host, n * sizeof(int32_t));
  }
  absl::Status CopyOut(float* host, const float* src, size_t n) override {
    if (n != 0 && host != src) std::memcpy(host, src, n * sizeof(float));
    return absl::OkStatus();
  }
  void Zero(float* p, size_t n) override {
    if (n != 0) std::memset(p, 0, n * sizeof(float));
  }
  void Widen(const uint16_t* src, DType dtype, float* dst, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      dst[i] = dtype == DType::kBF16 ? kernels::Bf16ToFloat(src[i]) : kernels::HalfToFloat(src[i]);
    }
  }
  void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N) override {
    nn::MatmulForward(a, w, bias, out, M, K, N);
  }
  void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias, int M,
                      int K, int N) override {
    nn::MatmulBackward(dout, a, w, da, dw, dbias, M, K, N);
  }
  void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N) override {
    nn::MatmulTransBForward(a, b, out, M, K, N);
  }
  void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M, int K,
                            int N) override {
    nn::MatmulTransBBackward(dout, a, b, da, db, M, K, N);
  }
  void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                        int C) override {
    nn::LayerNormForward(x, w, b, out, mean, rstd, N, C);
  }
  void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int N, int C) override {
    nn::LayerNormBackward(dout, x, w, mean, rstd, dx, dw, db, N, C);
  }
  void GeluForward(const float* x, float* out, size_t n) override { nn::GeluForward(x, out, n); }
  void GeluBackward(const float* x, const float* dout, float* dx, size_t n) override {
    nn::GeluBackward(x, dout, dx, n);
  }
  void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) override {
    nn::AttentionForward(qkv, out, att, B, T, C, NH);
  }
  void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt, int B,
                         int T, int C, int NH) override {
    nn::AttentionBackward(dout, qkv, att, dqkv, datt, B, T, C, NH);
  }
  absl::StatusOr<double> CrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                             int N, int V) override {
    return nn::CrossEntropyForward(logits, targets, probs, losses, N, V);
  }
  void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N,
                            int V) override {
    nn::CrossEntropyBackward(probs, targets, dlogits, dloss, N, V);
  }
  void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B, int T,
                        int C) override {
    nn::EmbeddingForward(tokens, wte, wpe, out, B, T, C);
  }
  void EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B, int T,
                         int C) override {
    nn::EmbeddingBackward(dout, tokens, dwte, dwpe, B, T, C);
  }
  void AddInto(float* dst, const float* src, size_t n) override { nn::AddInto(dst, src, n); }
  absl::Status Sync() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<NnBackend> MakeHostNn() { return std::make_unique<HostNn>(); }

AttentionBuffers ReferenceAttentionBuffers(int B, int T, int NH) {
  const size_t bhtt = size_t(B) * NH * T * T;
  return AttentionBuffers{bhtt, bhtt, false};
}

namespace {
size_t AlignTo256(size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

size_t FusedAttentionStatsBytes(int B, int T, int NH) { return AlignTo256(size_t(B) * NH * T * 4); }

AttentionBuffers FusedAttentionBuffers(int B, int T, int C, int NH) {
  return AttentionBuffers{(FusedAttentionStatsBytes(B, T, NH) + AlignTo256(size_t(B) * T * C * 2)) / 4, 0, true};
}

absl::StatusOr<Products> ParseProducts(const std::string& s) {
  if (s == "fp32") return Products::kF32;
  if (s == "tf32") return Products::kTf32;
  if (s == "bf16") return Products::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("--matmul '", s, "': use fp32, tf32 or bf16"));
}

absl::StatusOr<AttentionKind> ParseAttention(const std::string& s) {
  if (s == "auto") return AttentionKind::kAuto;
  if (s == "fused") return AttentionKind::kFused;
  if (s == "reference") return AttentionKind::kReference;
  return absl::InvalidArgumentError(absl::StrCat("--attention '", s, "': use auto, fused or reference"));
}

const char* ProductsName(Products p) {
  switch (p) {
    case Products::kF32: return "fp32";
    case Products::kTf32: return "tf32";
    case Products::kBf16: return "bf16";
  }
  return "?";
}

#if !STRATA_GPT_CUDA
absl::StatusOr<std::unique_ptr<NnBackend>> MakeCudaNn(const NnOptions&) {
  return absl::UnimplementedError("this build has no CUDA GPT back-end (STRATA_WITH_CUDA=OFF): use --device host");
}
#endif

}  // namespace strata::gpt
