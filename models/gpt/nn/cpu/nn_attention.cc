// Causal multi-head self-attention (nn.h): per (batch, head), scores = scale * Q K^T, a causal softmax
// per row, out = att V; the backward runs the same products in reverse. All products are oneDNN sgemm
// calls reading Q, K, V, dout and writing dQ, dK, dV in place inside the interleaved [B,T,3C] / [B,T,C]
// layouts through leading dimensions, so nothing is copied or allocated.
//
// Note [Causal row blocks]
// Queries are processed in blocks of kBlockRows rows; block [r0, r1) only ever needs keys [0, r1), so
// each product covers a lower block-triangle (about half the T x T work at T = 1024) while each sgemm
// stays a reasonably sized GEMM. Entries of a block's diagonal tile above the diagonal are computed and
// then overwritten: every row of att (and of the scratch datt, after the softmax backward) holds
// exactly 0 for t2 > t, so the att @ V and dK / dV products may read whole tiles: 0 * x adds nothing,
// which also makes the output at t bitwise independent of (finite) tokens after t.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cpu/nn.h"
#include "models/gpt/nn/cpu/nn_sgemm.h"

namespace strata::kernels::cpu {
namespace {

using internal::Sgemm;

constexpr int kBlockRows = 64;  // Note [Causal row blocks]

// row[0, len) <- softmax(row[0, len)) with the row max subtracted; row[len, T) <- 0. The max is a value
// ternary, not std::max, so it vectorises (Note [Vectorisable exp]).
void CausalSoftmaxRow(float* row, int len, int T) {
  float max_val = row[0];
#pragma omp simd reduction(max : max_val)
  for (int i = 1; i < len; ++i) max_val = row[i] > max_val ? row[i] : max_val;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < len; ++i) {
    row[i] = Exp(row[i] - max_val);
    sum += row[i];
  }
  const float inv = 1.0f / sum;  // sum >= 1: the max term is exp(0)
  for (int i = 0; i < len; ++i) row[i] *= inv;
  std::fill(row + len, row + T, 0.0f);
}

// Softmax backward of one row: d[i] <- p[i] * (d[i] - sum_j p[j] d[j]) on [0, len); d[len, T) <- 0.
void CausalSoftmaxBackwardRow(const float* p, float* d, int len, int T) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int i = 0; i < len; ++i) dot += p[i] * d[i];
  for (int i = 0; i < len; ++i) d[i] = p[i] * (d[i] - dot);
  std::fill(d + len, d + T, 0.0f);
}

}  // namespace

void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld_qkv = 3 * static_cast<int64_t>(C);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<int64_t>(b) * T * ld_qkv + static_cast<int64_t>(h) * hs;
      const float* k = q + C;
      const float* v = q + 2 * static_cast<int64_t>(C);
      float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      float* o = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
      for (int r0 = 0; r0 < T; r0 += kBlockRows) {
        const int r1 = std::min(T, r0 + kBlockRows);
        // scores[r0:r1, 0:r1] = scale * Q[r0:r1] @ K[0:r1]^T
        Sgemm("AttentionForward(q@k^T)", false, true, r1 - r0, r1, hs, scale, q + r0 * ld_qkv, ld_qkv, k, ld_qkv,
              0.0f, a + static_cast<int64_t>(r0) * T, T);
        for (int t = r0; t < r1; ++t) CausalSoftmaxRow(a + static_cast<int64_t>(t) * T, t + 1, T);
        // out[r0:r1] = att[r0:r1, 0:r1] @ V[0:r1]
        Sgemm("AttentionForward(att@v)", false, false, r1 - r0, hs, r1, 1.0f, a + static_cast<int64_t>(r0) * T, T,
              v, ld_qkv, 0.0f, o + static_cast<int64_t>(r0) * C, C);
      }
    }
  }
}

void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt, int B, int T,
                       int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld_qkv = 3 * static_cast<int64_t>(C);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t qkv_off = static_cast<int64_t>(b) * T * ld_qkv + static_cast<int64_t>(h) * hs;
      const float* q = qkv + qkv_off;
      const float* k = q + C;
      const float* v = q + 2 * static_cast<int64_t>(C);
      float* dq = dqkv + qkv_off;
      float* dk = dq + C;
      float* dv = dq + 2 * static_cast<int64_t>(C);
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      float* da = datt + (static_cast<int64_t>(b) * NH + h) * T * T;
      const float* dO = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
      for (int r0 = 0; r0 < T; r0 += kBlockRows) {
        const int r1 = std::min(T, r0 + kBlockRows);
        float* da_rows = da + static_cast<int64_t>(r0) * T;
        // datt[r0:r1, 0:r1] = dO[r0:r1] @ V[0:r1]^T, then the softmax backward turns it into
        // d(scores) / scale, zero above the diagonal (Note [Causal row blocks]).
        Sgemm("AttentionBackward(dout@v^T)", false, true, r1 - r0, r1, hs, 1.0f, dO + static_cast<int64_t>(r0) * C,
              C, v, ld_qkv, 0.0f, da_rows, T);
        for (int t = r0; t < r1; ++t) {
          CausalSoftmaxBackwardRow(a + static_cast<int64_t>(t) * T, da + static_cast<int64_t>(t) * T, t + 1, T);
        }
        // dQ[r0:r1] = scale * dscores[r0:r1, 0:r1] @ K[0:r1]
        Sgemm("AttentionBackward(dq)", false, false, r1 - r0, hs, r1, scale, da_rows, T, k, ld_qkv, 0.0f,
              dq + r0 * ld_qkv, ld_qkv);
      }
      // Keys and values see the queries at or after them: column block [c0, c1) reads rows [c0, T).
      for (int c0 = 0; c0 < T; c0 += kBlockRows) {
        const int c1 = std::min(T, c0 + kBlockRows);
        const int64_t tile = static_cast<int64_t>(c0) * T + c0;
        // dK[c0:c1] = scale * dscores[c0:T, c0:c1]^T @ Q[c0:T]
        Sgemm("AttentionBackward(dk)", true, false, c1 - c0, hs, T - c0, scale, da + tile, T, q + c0 * ld_qkv,
              ld_qkv, 0.0f, dk + c0 * ld_qkv, ld_qkv);
        // dV[c0:c1] = att[c0:T, c0:c1]^T @ dO[c0:T]
        Sgemm("AttentionBackward(dv)", true, false, c1 - c0, hs, T - c0, 1.0f, a + tile, T,
              dO + static_cast<int64_t>(c0) * C, C, 0.0f, dv + c0 * ld_qkv, ld_qkv);
      }
    }
  }
}

}  // namespace strata::kernels::cpu
