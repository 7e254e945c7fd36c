// The CUDA back-end of the GPT (nn_backend.h): the kernels/cuda twins of kernels/cpu/nn.h and cuBLASLt
// products (fp32, or TF32 when allowed), on one non-blocking stream of the calling thread's device.
// Built with STRATA_WITH_CUDA when cuBLASLt is found.
//
// Errors. A launch or cuBLASLt failure is remembered (the first one) and returned by the next Sync(),
// naming the operation; later operations still run (on possibly bad data) until then, as on a CUDA stream.
//
// Attention runs the plain reference kernels (kernels/cuda/attention.cuh, fp32, O(T^2) scores kept for the
// backward). The cuDNN fused attention (kernels/cuda/sdpa_cudnn.h, bf16) is not wired in yet.
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "examples/gpt/nn_backend.h"
#include "kernels/common/optimizer_arrays.h"
#include "kernels/cuda/add.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_rate.cuh"

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
  if (cudaMemset(p, 0, bytes) != cudaSuccess) return absl::InternalError("cudaMemset of GPT activations failed");
  return std::shared_ptr<T>(static_cast<T*>(p), [](T* q) { cudaFree(q); });
}

class CudaNn final : public NnBackend {
 public:
  CudaNn(cudaStream_t stream, void* workspace, std::unique_ptr<kc::MatmulContext> mm)
      : stream_(stream), mm_workspace_(workspace), mm_(std::move(mm)) {}
  ~CudaNn() override {
    cudaStreamSynchronize(stream_);
    mm_.reset();
    cudaFree(mm_workspace_);
    cudaFree(ln_workspace_);
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

  void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N) override {
    Check(kc::MatmulForward(*mm_, a, w, bias, out, M, K, N, false, kc::kMatmulF32, stream_), "matmul forward");
  }
  void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias, int M,
                      int K, int N) override {
    if (da != nullptr) Check(kc::MatmulBackwardData(*mm_, dout, w, da, M, K, N, kc::kMatmulF32, stream_), "matmul dA");
    if (dw != nullptr || dbias != nullptr) {
      if (dw != nullptr) {
        Check(kc::MatmulBackwardWeight(*mm_, dout, a, dw, dbias, M, K, N, kc::kMatmulF32, stream_), "matmul dW");
      } else {
        Check(mm_->BiasGrad(dout, dbias, M, N, kc::kMatmulF32, stream_), "matmul dbias");
      }
    }
  }
  void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N) override {
    Check(kc::MatmulTransBForward(*mm_, a, b, out, M, K, N, kc::kMatmulF32, stream_), "lm head forward");
  }
  void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M, int K,
                            int N) override {
    Check(kc::MatmulTransBBackwardData(*mm_, dout, b, da, M, K, N, kc::kMatmulF32, stream_), "lm head dA");
    Check(kc::MatmulTransBBackwardWeight(*mm_, dout, a, db, M, K, N, kc::kMatmulF32, stream_), "lm head dW");
  }
  void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                        int C) override {
    Check(kc::LaunchLayerNormForward(x, w, b, out, mean, rstd, N, C, 1e-5f, stream_), "layernorm forward");
  }
  void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int N, int C) override {
    const size_t need = kc::LayerNormBackwardWorkspaceBytes(N, C);
    if (need > ln_workspace_bytes_) {
      Check(cudaStreamSynchronize(stream_), "layernorm workspace");
      cudaFree(ln_workspace_);
      ln_workspace_ = nullptr;
      ln_workspace_bytes_ = 0;
      if (Check(cudaMalloc(&ln_workspace_, need), "layernorm workspace")) ln_workspace_bytes_ = need;
    }
    Check(kc::LaunchLayerNormBackward(dout, x, w, mean, rstd, dx, dw, db, N, C, static_cast<float*>(ln_workspace_),
                                      stream_),
          "layernorm backward");
  }
  void GeluForward(const float* x, float* out, size_t n) override {
    Check(kc::LaunchGeluForward(x, out, n, stream_), "gelu forward");
  }
  void GeluBackward(const float* x, const float* dout, float* dx, size_t n) override {
    Check(kc::LaunchGeluBackward(x, dout, dx, n, stream_), "gelu backward");
  }
  void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) override {
    Check(kc::LaunchAttentionForward(qkv, out, att, B, T, C, NH, stream_), "attention forward");
  }
  void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt, int B,
                         int T, int C, int NH) override {
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
  // Remembers the first failure; true when `e` is success.
  bool Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (first_.ok()) first_ = absl::InternalError(absl::StrCat("GPT on CUDA, ", what, ": ", cudaGetErrorString(e)));
    return false;
  }
  bool Check(const kc::MatmulStatus& s, const char* what) {
    if (s.ok()) return true;
    if (first_.ok()) first_ = absl::InternalError(absl::StrCat("GPT on CUDA, ", what, ": ", s.message));
    return false;
  }

  cudaStream_t stream_;
  void* mm_workspace_;
  std::unique_ptr<kc::MatmulContext> mm_;
  void* ln_workspace_ = nullptr;
  size_t ln_workspace_bytes_ = 0;
  void* mean_loss_ = nullptr;
  absl::Status first_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NnBackend>> MakeCudaNn(bool allow_tf32) {
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
  o.allow_tf32 = allow_tf32;
  std::unique_ptr<kc::MatmulContext> mm;
  const kc::MatmulStatus s = kc::MatmulContext::Create(workspace, kc::kMatmulRecommendedWorkspaceBytes, o, &mm);
  if (!s.ok()) {
    cudaFree(workspace);
    cudaStreamDestroy(stream);
    return absl::InternalError(absl::StrCat("cuBLASLt: ", s.message));
  }
  return std::unique_ptr<NnBackend>(new CudaNn(stream, workspace, std::move(mm)));
}

}  // namespace strata::gpt
