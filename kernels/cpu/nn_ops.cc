// The row-wise and elementwise kernels of nn.h: LayerNorm, GELU (tanh), softmax cross-entropy,
// embeddings, adds. Plain loops over the contiguous last dimension, written for GCC's vectoriser
// (reductions carry `omp simd` so they vectorise without -ffast-math; the library builds with
// -fopenmp-simd, which enables only these pragmas, no OpenMP runtime). Transcendentals (tanh, exp, log)
// are libm calls and stay scalar.
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
    for (int j = 0; j < C; ++j) {
      const float n = (xi[j] - m) * r;
      db[j] += gi[j];
      dw[j] += n * gi[j];
      dxi[j] += r * (w[j] * gi[j] - mean_g - n * mean_gn);
    }
  }
}

void GeluForward(const float* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + std::tanh(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

// gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2); sech^2 is taken
// as 1 - tanh^2 (no cosh, which overflows for |u| > ~89).
void GeluBackward(const float* x, const float* dout, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluScale * (v + kGeluCubic * v * v * v));
    const float sech2 = 1.0f - t * t;
    const float local = 0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dout[i] * local;
  }
}

double CrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses, int N, int V) {
  double total = 0.0;
  for (int i = 0; i < N; ++i) {
    const float* li = logits + static_cast<size_t>(i) * V;
    float* pi = probs + static_cast<size_t>(i) * V;
    float max_val = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_val)
    for (int j = 0; j < V; ++j) max_val = std::max(max_val, li[j]);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) {
      pi[j] = std::exp(li[j] - max_val);
      sum += pi[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < V; ++j) pi[j] *= inv;
    const int32_t t = targets[i];
    // loss = log(sum_j exp(l_j)) - l_t = log(sum) - (l_t - max): finite even when probs[t] underflows.
    const float loss = ValidTarget(t, V) ? static_cast<float>(std::log(sum) - static_cast<double>(li[t] - max_val))
                                         : kNaN;
    losses[i] = loss;
    total += loss;
  }
  return total / N;  // N == 0: 0/0 = NaN, the mean of no rows
}

// A target outside [0, V) has no gradient: its row is NaN, matching its NaN loss in the forward.
void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* pi = probs + static_cast<size_t>(i) * V;
    float* di = dlogits + static_cast<size_t>(i) * V;
    const int32_t t = targets[i];
    if (!ValidTarget(t, V)) {
      std::fill(di, di + V, kNaN);
      continue;
    }
    for (int j = 0; j < V; ++j) di[j] = pi[j] * dloss;
    di[t] = (pi[t] - 1.0f) * dloss;
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
