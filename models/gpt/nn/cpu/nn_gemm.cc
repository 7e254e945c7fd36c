// The matrix products of nn.h, all on oneDNN's row-major sgemm, and the sgemm wrapper the attention
// kernels share (nn_sgemm.h).
//
// Contracts (nn.h): activation gradients (da) are written with beta = 0, parameter gradients (dw, db,
// dbias) accumulate with beta = 1. Bias columns are summed in double so a long batch of rows does not
// lose the small ones; the products themselves are oneDNN's fp32 accumulation.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "models/gpt/nn/cpu/nn.h"
#include "models/gpt/nn/cpu/nn_sgemm.h"

namespace strata::kernels::cpu {
namespace internal {
namespace {

const char* DnnlStatusName(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out_of_memory";
    case dnnl_invalid_arguments: return "invalid_arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator_ends";
    case dnnl_runtime_error: return "runtime_error";
    case dnnl_not_required: return "not_required";
  }
  return "unknown";
}

// C = beta * C for the K == 0 product (no terms), honouring "beta == 0 never reads C".
void ScaleRows(float* C, int64_t M, int64_t N, int64_t ldc, float beta) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

}  // namespace

// Note [sgemm status]
// These kernels are a leaf library with no error channel (no Abseil; nn.h returns void), and every
// argument passed to dnnl_sgemm is derived here from the caller's shapes: dimensions are positive
// (empty products never reach oneDNN) and each leading dimension is at least its row length. So
// dnnl_invalid_arguments cannot come back for a valid call, and the only other failure oneDNN's CPU
// sgemm has is running out of memory for its internal packing scratch, which we treat like any
// failed allocation in the process. Either way continuing would hand the trainer silently wrong
// numbers, so a non-success status is a broken invariant: print the call and the status, then abort.
void Sgemm(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    ScaleRows(C, M, N, ldc, beta);
    return;
  }
  const char ta = trans_a ? 'T' : 'N';
  const char tb = trans_b ? 'T' : 'N';
  const dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (s != dnnl_success) {
    std::fprintf(stderr,
                 "strata: %s: dnnl_sgemm(transa=%c, transb=%c, M=%lld, N=%lld, K=%lld, alpha=%g, lda=%lld, ldb=%lld, "
                 "beta=%g, ldc=%lld) failed: dnnl status %d (%s)\n",
                 op, ta, tb, static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                 static_cast<double>(alpha), static_cast<long long>(lda), static_cast<long long>(ldb),
                 static_cast<double>(beta), static_cast<long long>(ldc), static_cast<int>(s), DnnlStatusName(s));
    std::abort();
  }
}

}  // namespace internal

namespace {

// Columns per block of the bias-gradient reduction: a double accumulator of this many lanes lives on
// the stack (2 KiB) and the inner loop runs contiguously over one row's slice.
constexpr int kBiasColumnBlock = 256;

// dbias[j] += sum_i dout[i, j], summed in double per column block.
void AccumulateColumnSums(const float* dout, float* dbias, int M, int N) {
  double acc[kBiasColumnBlock];
  for (int j0 = 0; j0 < N; j0 += kBiasColumnBlock) {
    const int width = std::min(kBiasColumnBlock, N - j0);
    std::fill(acc, acc + width, 0.0);
    for (int i = 0; i < M; ++i) {
      const float* row = dout + static_cast<size_t>(i) * N + j0;
      for (int j = 0; j < width; ++j) acc[j] += static_cast<double>(row[j]);
    }
    for (int j = 0; j < width; ++j) dbias[j0 + j] = static_cast<float>(dbias[j0 + j] + acc[j]);
  }
}

}  // namespace

void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N,
                   bool accumulate) {
  float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr) {
    // Seed out with the bias (or add it), then let sgemm accumulate the product on top.
    for (int i = 0; i < M; ++i) {
      float* row = out + static_cast<size_t>(i) * N;
      if (accumulate) {
        for (int j = 0; j < N; ++j) row[j] += bias[j];
      } else {
        std::copy(bias, bias + N, row);
      }
    }
    beta = 1.0f;
  }
  internal::Sgemm("MatmulForward", false, false, M, N, K, 1.0f, a, K, w, N, beta, out, N);
}

void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias, int M,
                    int K, int N) {
  if (da != nullptr) {  // da[M,K] = dout[M,N] @ w[K,N]^T
    internal::Sgemm("MatmulBackward(da)", false, true, M, K, N, 1.0f, dout, N, w, N, 0.0f, da, K);
  }
  if (dw != nullptr) {  // dw[K,N] += a[M,K]^T @ dout[M,N]
    internal::Sgemm("MatmulBackward(dw)", true, false, K, N, M, 1.0f, a, K, dout, N, 1.0f, dw, N);
  }
  if (dbias != nullptr) AccumulateColumnSums(dout, dbias, M, N);
}

void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N) {
  // out[M,N] = a[M,K] @ b[N,K]^T
  internal::Sgemm("MatmulTransBForward", false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, out, N);
}

void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M, int K,
                          int N) {
  // da[M,K] = dout[M,N] @ b[N,K]
  internal::Sgemm("MatmulTransBBackward(da)", false, false, M, K, N, 1.0f, dout, N, b, K, 0.0f, da, K);
  // db[N,K] += dout[M,N]^T @ a[M,K]
  internal::Sgemm("MatmulTransBBackward(db)", true, false, N, K, M, 1.0f, dout, N, a, K, 1.0f, db, K);
}

}  // namespace strata::kernels::cpu
