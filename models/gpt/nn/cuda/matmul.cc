// cuBLASLt products (see matmul.h; the operand mapping is Note [Row-major products on a column-major
// library] in matmul_plan.h).
#include "models/gpt/nn/cuda/matmul.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "models/gpt/nn/cuda/matmul_bias.cuh"
#include "models/gpt/nn/cuda/matmul_internal.h"

namespace strata::kernels::cuda {
namespace internal {

MatmulStatus MatmulFailure(MatmulCode code, int foreign_code, std::string message) {
  return MatmulStatus{code, foreign_code, std::move(message)};
}

MatmulStatus CudaFailure(const char* call, cudaError_t err, const char* file, int line) {
  return MatmulFailure(MatmulCode::kCudaError, static_cast<int>(err),
                       std::string(call) + " at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(err) +
                           " (" + cudaGetErrorString(err) + ")");
}

}  // namespace internal

namespace {

using internal::MatmulFailure;

MatmulStatus CublasFailure(const char* call, cublasStatus_t s, const char* file, int line) {
  return MatmulFailure(MatmulCode::kCublasError, static_cast<int>(s),
                       std::string(call) + " at " + file + ":" + std::to_string(line) + ": " +
                           cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
}

// Each cuBLASLt call is wrapped where it happens (CUDA calls: STRATA_MM_CUDA_CALL, matmul_internal.h).
#define STRATA_LT_CALL(call)                                              \
  do {                                                                    \
    const cublasStatus_t strata_lt_status_ = (call);                      \
    if (strata_lt_status_ != CUBLAS_STATUS_SUCCESS) {                     \
      return CublasFailure(#call, strata_lt_status_, __FILE__, __LINE__); \
    }                                                                     \
  } while (0)

// Move-only owners of the cuBLASLt descriptors.
template <class T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const { Destroy(p); }
};
using MatmulDescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                      LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                  LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using PreferencePtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                      LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

cudaDataType_t CudaType(MatmulDtype t) { return t == MatmulDtype::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

// One cached product: descriptors, layouts and the heuristic's algorithm. `usable` is false when the
// heuristic found nothing (kept, so a fused-bias product that cuBLASLt cannot fuse asks only once).
struct Plan {
  MatmulDescPtr desc;
  LayoutPtr a, b, c;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
};

// Note [Fused bias]
// The bias goes through cuBLASLt's CUBLASLT_EPILOGUE_BIAS (D = A B + beta C + bias, one rounding) when its
// type is the output's, the epilogue's documented default (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE unset),
// and it is at least 16-byte aligned: the heuristic reads the bias pointer's alignment, but no preference
// states it, and less aligned bias vectors have been reported to fail in the epilogue, so we do not offer
// them. Otherwise, or when the heuristic has no fused algorithm, the product runs plain and
// LaunchAddBiasRows adds the bias afterwards (a second rounding for bf16 outputs).
constexpr uint32_t kMinFusedBiasAlignment = 16;

std::string Describe(const MatmulKey& k) {
  const ColumnMajorGemm& g = k.gemm;
  return "column-major m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         (g.trans_a ? " A^T" : " A") + (g.trans_b ? " B^T" : " B") + " lda=" + std::to_string(g.lda) +
         " ldb=" + std::to_string(g.ldb) + " ldc=" + std::to_string(g.ldc) + " in=" + MatmulDtypeName(k.in) +
         " out=" + MatmulDtypeName(k.out) + (k.fused_bias ? std::string(" bias=") + MatmulDtypeName(k.bias) : "") +
         (k.tf32 ? " tf32" : "");
}

template <class T>
MatmulStatus SetDescAttr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  STRATA_LT_CALL(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
  return {};
}

template <class T>
MatmulStatus SetPrefAttr(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  STRATA_LT_CALL(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
  return {};
}

MatmulStatus MakeLayout(MatmulDtype t, int64_t rows, int64_t cols, int64_t ld, LayoutPtr* out) {
  cublasLtMatrixLayout_t l = nullptr;
  STRATA_LT_CALL(
      cublasLtMatrixLayoutCreate(&l, CudaType(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  out->reset(l);
  return {};
}

// Row-major argument checks (nn.h's shapes are packed, so these only catch caller bugs).
MatmulStatus CheckGemm(const RowMajorGemm& g, const void* x, const void* y, void* c, float beta, const MatmulTypes& t) {
  std::string bad;
  if (!MatmulTypesSupported(t)) bad = "unsupported types (f32 factors with a bf16 destination)";
  if (g.m < 0 || g.n < 0 || g.k < 0) bad = "negative dimension";
  if (beta != 0.0f && beta != 1.0f) bad = "beta must be 0 or 1";
  if (g.ldx < (g.trans_x ? g.m : g.k) || g.ldy < (g.trans_y ? g.k : g.n) || g.ldc < g.n) bad = "row stride too small";
  if (g.m > 0 && g.n > 0 && (c == nullptr || (g.k > 0 && (x == nullptr || y == nullptr)))) bad = "null operand";
  if (bad.empty()) return {};
  return MatmulFailure(
      MatmulCode::kInvalidArgument, 0,
      "Gemm(m=" + std::to_string(g.m) + ", n=" + std::to_string(g.n) + ", k=" + std::to_string(g.k) + "): " + bad);
}

}  // namespace

struct MatmulContext::Impl {
  Impl(void* ws, size_t ws_bytes, const MatmulOptions& o)
      : workspace(ws), workspace_bytes(ws_bytes), options(o), cache(o.plan_cache_capacity) {}
  ~Impl() {
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  MatmulStatus BuildPlan(const MatmulKey& key, const void* bias, Plan* plan);
  MatmulStatus FindOrBuild(const MatmulKey& key, const void* bias, Plan** plan);

  cublasLtHandle_t handle = nullptr;
  void* workspace;
  size_t workspace_bytes;
  MatmulOptions options;
  MatmulPlanCache<Plan> cache;  // destroyed before the handle (declared after it)
  uint64_t heuristic_calls = 0;
};

MatmulStatus MatmulContext::Impl::BuildPlan(const MatmulKey& key, const void* bias, Plan* plan) {
  const ColumnMajorGemm& g = key.gemm;
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc = nullptr;
  STRATA_LT_CALL(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  plan->desc.reset(desc);
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_MM_RETURN_IF_ERROR(SetDescAttr(desc, CUBLASLT_MATMUL_DESC_TRANSA, ta));
  STRATA_MM_RETURN_IF_ERROR(SetDescAttr(desc, CUBLASLT_MATMUL_DESC_TRANSB, tb));
  if (key.fused_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    STRATA_MM_RETURN_IF_ERROR(SetDescAttr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
    STRATA_MM_RETURN_IF_ERROR(SetDescAttr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));  // its alignment counts
  }
  STRATA_MM_RETURN_IF_ERROR(MakeLayout(key.in, g.a_rows, g.a_cols, g.lda, &plan->a));
  STRATA_MM_RETURN_IF_ERROR(MakeLayout(key.in, g.b_rows, g.b_cols, g.ldb, &plan->b));
  STRATA_MM_RETURN_IF_ERROR(MakeLayout(key.out, g.c_rows, g.c_cols, g.ldc, &plan->c));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  STRATA_LT_CALL(cublasLtMatmulPreferenceCreate(&raw_pref));
  const PreferencePtr pref(raw_pref);
  STRATA_MM_RETURN_IF_ERROR(
      SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes)));
  STRATA_MM_RETURN_IF_ERROR(SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a));
  STRATA_MM_RETURN_IF_ERROR(SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b));
  STRATA_MM_RETURN_IF_ERROR(SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c));
  STRATA_MM_RETURN_IF_ERROR(SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ++heuristic_calls;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, desc, plan->a.get(), plan->b.get(), plan->c.get(),
                                                          plan->c.get(), raw_pref, 1, &result, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return {};  // no algorithm: plan stays unusable
  if (s != CUBLAS_STATUS_SUCCESS) return CublasFailure("cublasLtMatmulAlgoGetHeuristic", s, __FILE__, __LINE__);
  plan->usable = found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  plan->algo = result.algo;
  return {};
}

MatmulStatus MatmulContext::Impl::FindOrBuild(const MatmulKey& key, const void* bias, Plan** plan) {
  *plan = cache.Find(key);
  if (*plan != nullptr) return {};
  Plan fresh;
  STRATA_MM_RETURN_IF_ERROR(BuildPlan(key, bias, &fresh));
  *plan = cache.Insert(key, std::move(fresh));
  return {};
}

MatmulStatus MatmulContext::Create(void* workspace, size_t workspace_bytes, const MatmulOptions& options,
                                   std::unique_ptr<MatmulContext>* out) {
  if (workspace == nullptr && workspace_bytes != 0) {
    return MatmulFailure(MatmulCode::kInvalidArgument, 0, "MatmulContext::Create: null workspace of nonzero size");
  }
  auto impl = std::make_unique<Impl>(workspace, workspace_bytes, options);
  STRATA_LT_CALL(cublasLtCreate(&impl->handle));
  out->reset(new MatmulContext(std::move(impl)));
  return {};
}

MatmulContext::MatmulContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MatmulContext::~MatmulContext() = default;

uint64_t MatmulContext::heuristic_calls() const { return impl_->heuristic_calls; }
size_t MatmulContext::cached_plans() const { return impl_->cache.size(); }

MatmulStatus MatmulContext::Gemm(const RowMajorProduct& p, const void* bias, const MatmulTypes& types,
                                 cudaStream_t stream) {
  const RowMajorGemm& g = p.gemm;
  const void* x = p.x;
  const void* y = p.y;
  void* c = p.c;
  const float beta = p.beta;
  STRATA_MM_RETURN_IF_ERROR(CheckGemm(g, x, y, c, beta, types));
  if (g.m == 0 || g.n == 0) return {};
  const size_t out_bytes = MatmulDtypeBytes(types.out);
  bool bias_pending = bias != nullptr;
  if (g.k == 0) {  // an empty sum: C = beta * C, then the bias
    if (beta == 0.0f) {
      STRATA_MM_CUDA_CALL(cudaMemset2DAsync(c, static_cast<size_t>(g.ldc) * out_bytes, 0,
                                            static_cast<size_t>(g.n) * out_bytes, static_cast<size_t>(g.m), stream));
    }
  } else {
    const auto addr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
    const bool fuse = bias_pending && types.bias == types.out && PointerAlignment(addr(bias)) >= kMinFusedBiasAlignment;
    Plan* plan = nullptr;
    MatmulKey key = MakeMatmulKey(g, types, fuse, impl_->options.allow_tf32, addr(x), addr(y), addr(c), addr(bias));
    STRATA_MM_RETURN_IF_ERROR(impl_->FindOrBuild(key, bias, &plan));
    if (!plan->usable && fuse) {  // cuBLASLt cannot fuse this bias: plain product, then the add kernel
      key = MakeMatmulKey(g, types, false, impl_->options.allow_tf32, addr(x), addr(y), addr(c), 0);
      STRATA_MM_RETURN_IF_ERROR(impl_->FindOrBuild(key, nullptr, &plan));
    }
    if (!plan->usable) {
      return MatmulFailure(MatmulCode::kUnsupported, static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED),
                           "cublasLtMatmulAlgoGetHeuristic found no algorithm for " + Describe(key));
    }
    if (key.fused_bias) {
      STRATA_MM_RETURN_IF_ERROR(SetDescAttr(plan->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
      bias_pending = false;
    }
    const float alpha = 1.0f;
    STRATA_LT_CALL(cublasLtMatmul(impl_->handle, plan->desc.get(), &alpha, y, plan->a.get(), x, plan->b.get(), &beta, c,
                                  plan->c.get(), c, plan->c.get(), &plan->algo, impl_->workspace,
                                  impl_->workspace_bytes, stream));
  }
  if (bias_pending) {  // Note [Fused bias]
    STRATA_MM_CUDA_CALL(LaunchAddBiasRows(c, types.out, bias, types.bias, g.m, g.n, g.ldc, stream));
  }
  return {};
}

MatmulStatus MatmulContext::BiasGrad(const void* dout, void* dbias, int M, int N, const MatmulTypes& types,
                                     cudaStream_t stream) {
  if (M < 0 || N < 0 || (M > 0 && N > 0 && (dout == nullptr || dbias == nullptr))) {
    return MatmulFailure(
        MatmulCode::kInvalidArgument, 0,
        "BiasGrad(M=" + std::to_string(M) + ", N=" + std::to_string(N) + "): bad shape or null operand");
  }
  STRATA_MM_CUDA_CALL(LaunchBiasGrad(dout, types.in, dbias, types.bias, M, N, static_cast<float*>(impl_->workspace),
                                     impl_->workspace_bytes, stream));
  return {};
}

MatmulStatus MatmulForward(MatmulContext& ctx, const void* a, const void* w, const void* bias, void* out, int M, int K,
                           int N, bool accumulate, const MatmulTypes& types, cudaStream_t stream) {
  return ctx.Gemm(ForwardProduct(a, w, out, M, K, N, accumulate), bias, types, stream);
}

MatmulStatus MatmulBackwardData(MatmulContext& ctx, const void* dout, const void* w, void* da, int M, int K, int N,
                                const MatmulTypes& types, cudaStream_t stream) {
  return ctx.Gemm(BackwardDataProduct(dout, w, da, M, K, N), nullptr, types, stream);
}

MatmulStatus MatmulBackwardWeight(MatmulContext& ctx, const void* dout, const void* a, void* dw, void* dbias, int M,
                                  int K, int N, const MatmulTypes& types, cudaStream_t stream) {
  if (dw != nullptr) {
    STRATA_MM_RETURN_IF_ERROR(ctx.Gemm(BackwardWeightProduct(dout, a, dw, M, K, N), nullptr, types, stream));
  }
  if (dbias != nullptr) return ctx.BiasGrad(dout, dbias, M, N, types, stream);
  return {};
}

MatmulStatus MatmulTransBForward(MatmulContext& ctx, const void* a, const void* b, void* out, int M, int K, int N,
                                 const MatmulTypes& types, cudaStream_t stream) {
  return ctx.Gemm(TransBForwardProduct(a, b, out, M, K, N), nullptr, types, stream);
}

MatmulStatus MatmulTransBBackwardData(MatmulContext& ctx, const void* dout, const void* b, void* da, int M, int K,
                                      int N, const MatmulTypes& types, cudaStream_t stream) {
  return ctx.Gemm(TransBBackwardDataProduct(dout, b, da, M, K, N), nullptr, types, stream);
}

MatmulStatus MatmulTransBBackwardWeight(MatmulContext& ctx, const void* dout, const void* a, void* db, int M, int K,
                                        int N, const MatmulTypes& types, cudaStream_t stream) {
  return ctx.Gemm(TransBBackwardWeightProduct(dout, a, db, M, K, N), nullptr, types, stream);
}

}  // namespace strata::kernels::cuda
