// Internal to the nn kernels (nn_gemm.cc, nn_attention.cc): the one place that calls oneDNN's sgemm.
//
// Sgemm computes, row-major, C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C with BLAS semantics:
// beta == 0 means C is only written, never read (so garbage or NaN in C does not leak), and K == 0
// means C = beta * C. The wrapper makes both hold for every shape, including the ones oneDNN rejects
// or treats differently (M or N == 0: nothing to do; K == 0: oneDNN leaves C untouched even for
// beta == 0). A failing status aborts after printing the call: see Note [sgemm status] in nn_gemm.cc.
#pragma once

#include <cstdint>

namespace strata::kernels::cpu::internal {

// `op` names the calling kernel for the abort message. lda/ldb/ldc are row strides in elements.
void Sgemm(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace strata::kernels::cpu::internal
