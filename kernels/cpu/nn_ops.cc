// The row-wise and elementwise kernels of nn.h: LayerNorm, GELU (tanh), softmax cross-entropy,
// embeddings, adds. Plain loops over the contiguous last dimension, written for GCC's vectoriser
// (reductions carry `omp simd` so they vectorise without -ffast-math; the library builds with
// -fopenmp-simd, which enables only these pragmas, no OpenMP runtime). exp is internal::Exp, which
// vectorises (Note [Vectorisable exp]); GELU needs one exp per element (Note [GELU through the
// logistic]). Selects are value ternaries, not std::min / std::max, for the same reason.
//
// Numerics: LayerNorm takes the mean first and the variance of the deviations second (two passes; a
// one-pass E[x^2] - E[x]^2 in fp32 cancels catastrophically once |mean| >> stddev). Softmax subtracts the
// row max; cross-entropy is log-sum-exp, so a target whose probability underflows still has a finite
// loss, and sums each row in double.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_exp.h"

namespace strata::kernels::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool ValidTarget(int32_t t, int V) { return t >= 0 && t < V; }

}  // namespace

void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                      int C, float eps) {
  for (int i = 0; i < N; ++i) {
    const float* xi = x + static_cast<size_t>(i) * C;
    float* oi = out + static_cast<size_t>(i) * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < C; ++j) sum += xi[j];
    const float m = sum / static_cast<float>(C);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int j = 0; j < C; ++j) {
      const float d = xi[j] - m;
      sq += d * d;
    }
    const float r = 1.0f / std::sqrt(sq / static_cast<float>(C) + eps);
    for (int j = 0; j < C; ++j) oi[j] = (xi[j] - m) * r * w[j] + b[j];
    mean[i] = m;
    rstd[i] = r;
  }
}

// With n = (x - mean) * rstd and g = w * dout, per row:
//   dx += rstd * (g - mean(g) - n * mean(g * n)),  dw += n * dout,  db += dout.
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
      sum_gn += g * ((xi[j] - m) * r);
    }
    const float mean_g = sum_g / static_cast<float>(C);
    const float mean_gn = sum_gn / static_cast<float>(C);
    // Two loops rather than one: with all three outputs in one loop GCC 12 leaves it scalar
    // (-fopt-info-vec-missed); split, each vectorises behind run-time alias checks.
    for (int j = 0; j < C; ++j) dxi[j] += r * (w[j] * gi[j] - mean_g - (xi[j] - m) * r * mean_gn);
    for (int j = 0; j < C; ++j) {
      db[j] += gi[j];
      dw[j] += (xi[j] - m) * r * gi[j];
    }
  }
}

// Note [GELU through the logistic]
// 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) exactly, so gelu(x) = x * s with s = sigmoid(2u),
// u = sqrt(2/pi) (x + 0.044715 x^3). Evaluated this way it is the same function with one exp, which
// vectorises (Note [Vectorisable exp]), instead of glibc's tanhf (~15-20 ns an element measured here,
// and a call that keeps the loop scalar); it is also more accurate for x < 0, where 1 + tanh u
// cancels. The exponent is capped at kGeluExpCap so exp never overflows (which would make 1 - s = e s
// an inf * 0); past the cap (x < ~-9.4) s is e^-80 instead of smaller: gelu(x) ~ x e^-80 either way,
// far below the fp32 resolution of the values around it.
namespace {

constexpr float kGeluExpCap = 80.0f;

// e = exp(-2u) (capped), so that s = sigmoid(2u) = 1 / (1 + e).
float GeluExpNeg2u(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float arg = -2.0f * u;
  return internal::Exp(arg > kGeluExpCap ? kGeluExpCap : arg);  // NaN compares false: stays NaN
}

}  // namespace

void GeluForward(const float* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + GeluExpNeg2u(x[i]));
}

// gelu'(x) = s + 2 x s (1 - s) u'(x), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2), with 1 - s = e s taken
// without cancellation (Note [GELU through the logistic]); this equals the tanh form
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'.
void GeluBackward(const float* x, const float* dout, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float e = GeluExpNeg2u(v);
    const float s = 1.0f / (1.0f + e);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dout[i] * (s + 2.0f * v * s * (e * s) * du);
  }
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
    const float target_logit = ValidTarget(t, V) ? li[t] : kNaN;  // before pi overwrites li
    float max_val = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_val)
    for (int j = 0; j < V; ++j) max_val = li[j] > max_val ? li[j] : max_val;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) {
      pi[j] = internal::Exp(li[j] - max_val);
      sum += pi[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < V; ++j) pi[j] *= inv;
    // loss = log(sum_j exp(l_j)) - l_t = log(sum) - (l_t - max): finite even when probs[t] underflows.
    // An invalid target carries NaN through target_logit.
    const float loss = static_cast<float>(std::log(sum) - static_cast<double>(target_logit - max_val));
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
      std::fill(di, di + V, kNaN);
      continue;
    }
    const float target_prob = pi[t];
    for (int j = 0; j < V; ++j) di[j] = pi[j] * dloss;
    di[t] = (target_prob - 1.0f) * dloss;
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
