// The row-wise and elementwise kernels of nn.h: LayerNorm, GELU (tanh), softmax cross-entropy,
// embeddings, adds. Plain loops over the contiguous last dimension, written for GCC's vectoriser
// (reductions carry `omp simd` so they vectorise without -ffast-math; the library builds with
// -fopenmp-simd, which enables only these pragmas, no OpenMP runtime). The per-element formulas are
// models/gpt/nn/common/nn_math.h, shared with the CUDA twins (kernels/cuda): exp is its Exp, which vectorises
// (Note [Vectorisable exp]); GELU needs one exp per element (Note [GELU through the logistic]). Selects
// are value ternaries, not std::min / std::max, for the same reason.
//
// Numerics: LayerNorm takes the mean first and the variance of the deviations second (two passes; a
// one-pass E[x^2] - E[x]^2 in fp32 cancels catastrophically once |mean| >> stddev). Softmax subtracts the
// row max; cross-entropy is log-sum-exp, so a target whose probability underflows still has a finite
// loss, and sums each row in double.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cpu/nn.h"

namespace strata::kernels::cpu {

void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                      int C, float eps) {
  for (int i = 0; i < N; ++i) {
    const float* xi = x + static_cast<size_t>(i) * C;
    float* oi = out + static_cast<size_t>(i) * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < C; ++j) sum += xi[j];
    const float m = RowMean(sum, C);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int j = 0; j < C; ++j) {
      const float d = xi[j] - m;
      sq += d * d;
    }
    const float r = LayerNormRstd(sq, C, eps);
    for (int j = 0; j < C; ++j) oi[j] = LayerNormOut(xi[j], m, r, w[j], b[j]);
    mean[i] = m;
    rstd[i] = r;
  }
}

// Per row (nn_math.h LayerNormDx): dx += rstd * (g - mean(g) - n * mean(g * n)), dw += n * dout,
// db += dout, with n = (x - mean) * rstd and g = w * dout.
void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                       float* dx, float* dw, float* db, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const size_t off = static_cast<size_t>(i) * C;
    const float* xi = x + off;
    const float* gi = dout + off;
    float* dxi = dx + off;
    const float m = mean[i];
    const float r = rstd[i];
    float sum_g = 0.0f;
    float sum_gn = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gn)
    for (int j = 0; j < C; ++j) {
      const float g = w[j] * gi[j];
      sum_g += g;
      sum_gn += g * LayerNormNormalized(xi[j], m, r);
    }
    const float mean_g = RowMean(sum_g, C);
    const float mean_gn = RowMean(sum_gn, C);
    // Two loops rather than one: with all three outputs in one loop GCC 12 leaves it scalar
    // (-fopt-info-vec-missed); split, each vectorises behind run-time alias checks.
    for (int j = 0; j < C; ++j) dxi[j] += LayerNormDx(xi[j], m, r, w[j], gi[j], mean_g, mean_gn);
    for (int j = 0; j < C; ++j) {
      db[j] += gi[j];
      dw[j] += LayerNormNormalized(xi[j], m, r) * gi[j];
    }
  }
}

// GELU through the logistic (Note [GELU through the logistic], nn_math.h).
void GeluForward(const float* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Gelu(x[i]);
}

// dx = dout * gelu'(x) (written).
void GeluBackward(const float* x, const float* dout, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = dout[i] * GeluGrad(x[i]);
}

// Note [Cross-entropy in place]
// logits, probs and dlogits are the largest activations of the model (N x V), so both functions allow
// their input and output to be the same buffer (probs == logits, dlogits == probs): every element is
// read before it is written, and the one value needed after a row is overwritten (the target's logit,
// the target's probability) is read first.
double CrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses, int N, int V) {
  double total = 0.0;
  for (int i = 0; i < N; ++i) {
    const float* li = logits + static_cast<size_t>(i) * V;
    float* pi = probs + static_cast<size_t>(i) * V;
    const int32_t t = targets[i];
    const float target_logit = ValidTarget(t, V) ? li[t] : QuietNaN();  // before pi overwrites li
    float max_val = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_val)
    for (int j = 0; j < V; ++j) max_val = li[j] > max_val ? li[j] : max_val;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) {
      pi[j] = Exp(li[j] - max_val);
      sum += pi[j];
    }
    const float inv = SoftmaxInv(sum);
    for (int j = 0; j < V; ++j) pi[j] *= inv;
    const float loss = CrossEntropyLoss(sum, target_logit, max_val);  // NaN for an invalid target
    losses[i] = loss;
    total += loss;
  }
  return total / N;  // N == 0: 0/0 = NaN, the mean of no rows
}

// A target outside [0, V) has no gradient: its row is NaN, matching its NaN loss in the forward.
// dlogits may be probs (Note [Cross-entropy in place]).
void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* pi = probs + static_cast<size_t>(i) * V;
    float* di = dlogits + static_cast<size_t>(i) * V;
    const int32_t t = targets[i];
    if (!ValidTarget(t, V)) {
      std::fill(di, di + V, QuietNaN());
      continue;
    }
    const float target_prob = pi[t];  // before di may overwrite it
    for (int j = 0; j < V; ++j) di[j] = CrossEntropyGrad(pi[j], false, dloss);
    di[t] = CrossEntropyGrad(target_prob, true, dloss);
  }
}

void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(b) * T + t;
      const float* e = wte + static_cast<size_t>(tokens[row]) * C;
      const float* p = wpe + static_cast<size_t>(t) * C;
      float* o = out + row * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(b) * T + t;
      const float* g = dout + row * C;
      float* de = dwte + static_cast<size_t>(tokens[row]) * C;
      float* dp = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        de[c] += g[c];
        dp[c] += g[c];
      }
    }
  }
}

void AddInto(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void Add(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace strata::kernels::cpu
