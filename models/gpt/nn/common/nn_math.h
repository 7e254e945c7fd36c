// Per-element and per-row math of the GPT NN kernels, shared by the host kernels (models/gpt/nn/cpu/nn_ops.cc,
// nn_attention.cc) and their CUDA twins (kernels/cuda/{gelu,layernorm,cross_entropy,attention}.cu).
//
// Every function is __host__ __device__ under nvcc and plain inline otherwise (STRATA_HD, element_math.h),
// so the host tests (tests/models/gpt/nn/common/nn_math_test.cc, tests/models/gpt/nn/cpu/nn_test.cc) cover the
// arithmetic the device runs. The functions are written as the exact float operation sequence both sides execute; with
// contraction off on both (the host library builds in ISO mode, GCC's -ffp-contract=off default, and without FMA flags;
// the CUDA library with --fmad=false), IEEE division and sqrt, and denormals kept, an element computed by the same
// function gives the same bits on host and device. Row reductions (sums, maxima) are the callers' own: their order
// differs between back-ends, so those results agree only to rounding. No Abseil, no runtime/, no std:: calls that are
// host-only.
#pragma once

#include <cstdint>

#include "kernels/common/element_math.h"

namespace strata::kernels {

// ---- exp ----

// Note [Vectorisable exp]
// glibc's expf is a call, so a host loop containing it stays scalar (~2-4 ns an element measured here, the
// largest non-GEMM cost of attention at T = 1024); its SIMD variants are only declared under -ffast-math,
// which we do not use. Exp is branch-free inline arithmetic instead: Cody-Waite reduction x = n ln2 + r
// with |r| <= ln2 / 2, Cephes' degree-6 polynomial for e^r, and 2^n added to the exponent bits. Error
// <= 1 ulp against exp in double over [-87.33, 88.72] (tests/models/gpt/nn/common/nn_math_test.cc). Edges:
// x < -87.33 (results below ~1.2e-38, the smallest normals) gives 0 where libm gives a (sub)normal,
// x > 88.7228 (ln of FLT_MAX) gives +inf, NaN gives NaN. The selects are plain ternaries on values (not
// std::min, which returns a reference and blocks if-conversion); the host library builds with
// -fno-trapping-math so GCC may if-convert float compares (it changes no value: we never read FP
// exception flags). The device uses the same function (not __expf) so that softmax and GELU elements
// are the host's bits.
STRATA_HD float Exp(float x) {
  constexpr float kMinArg = -87.33f;          // ~ln(2^-125.99): keeps 2^n p normal (p >= 1 at n = -126)
  constexpr float kMaxArg = 88.72283f;        // just below ln(2^128)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;      // ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 bits, so n * kLn2Hi
  constexpr float kLn2Lo = -2.12194440e-4f;   // is exact for |n| <= 128
  constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer in the low bits
  constexpr uint32_t kInfBits = 0x7f800000u;
  float xc = x < kMinArg ? kMinArg : x;
  xc = xc > kMaxArg ? kMaxArg : xc;
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;  // round(x / ln 2), in [-126, 128]
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;  // e^r, in [0.70, 1.42]
  // The low bits of t hold n (two's complement, offset by kRound's bits); shift it into the exponent.
  const uint32_t exponent = (FloatBits(t) - FloatBits(kRound)) << 23;
  float y = BitsFloat(FloatBits(p) + exponent);
  y = x < kMinArg ? 0.0f : y;
  y = x > kMaxArg ? BitsFloat(kInfBits) : y;
  return x != x ? x : y;
}

STRATA_HD float QuietNaN() { return BitsFloat(0x7fc00000u); }

// Mean of a row from its sum (LayerNorm's mean, and the row means of its backward).
STRATA_HD float RowMean(float sum, int n) { return sum / static_cast<float>(n); }

// ---- GELU, tanh approximation (GPT-2's "gelu_new") ----

// Note [GELU through the logistic]
// 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) exactly, so gelu(x) = x * s with s = sigmoid(2u),
// u = sqrt(2/pi) (x + 0.044715 x^3). Evaluated this way it is the same function with one exp, which
// vectorises on the host (Note [Vectorisable exp]), instead of glibc's tanhf (~15-20 ns an element
// measured here, and a call that keeps the loop scalar); it is also more accurate for x < 0, where
// 1 + tanh u cancels. The exponent is capped at kGeluExpCap so exp never overflows (which would make
// 1 - s = e s an inf * 0); past the cap (x < ~-9.7) s is e^-80 instead of smaller: gelu(x) ~ x e^-80
// either way, far below the fp32 resolution of the values around it.
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kGeluExpCap = 80.0f;
// GeluGrad clamps x to [-kGeluGradClamp, kGeluGradClamp]. Beyond it the derivative is 1 (x > 10: the
// formula already rounds to exactly 1.0f there) or 0 to within 1e-32 (x < -10). Without the clamp the
// capped s of Note [GELU through the logistic] times u'(x) ~ x^2 grows without bound for very negative
// x (wrong past x ~ -1e9), and x^2 overflows for |x| > ~1.8e19 (inf * 0 = NaN).
inline constexpr float kGeluGradClamp = 10.0f;

// e = exp(-2u) (capped), so that s = sigmoid(2u) = 1 / (1 + e).
STRATA_HD float GeluExpNeg2u(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float arg = -2.0f * u;
  return Exp(arg > kGeluExpCap ? kGeluExpCap : arg);  // NaN compares false: stays NaN
}

STRATA_HD float Gelu(float x) { return x / (1.0f + GeluExpNeg2u(x)); }

// gelu'(x) = s + 2 x s (1 - s) u'(x), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2), with 1 - s = e s taken
// without cancellation (Note [GELU through the logistic]); this equals the tanh form
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'. x is clamped first (kGeluGradClamp); NaN stays NaN.
STRATA_HD float GeluGrad(float x) {
  float v = x > kGeluGradClamp ? kGeluGradClamp : x;
  v = v < -kGeluGradClamp ? -kGeluGradClamp : v;
  const float e = GeluExpNeg2u(v);
  const float s = 1.0f / (1.0f + e);
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
  return s + 2.0f * v * s * (e * s) * du;
}

// ---- LayerNorm over a row of C ----
// Two passes (models/gpt/nn/cpu/nn_ops.cc): mean = RowMean(sum x), then rstd from the sum of squared
// deviations, never E[x^2] - E[x]^2 (it cancels in fp32 once |mean| >> stddev).

STRATA_HD float LayerNormRstd(float sum_sq_dev, int C, float eps) {
  return 1.0f / sqrtf(sum_sq_dev / static_cast<float>(C) + eps);
}

// n = (x - mean) * rstd, the normalised input (also the weight gradient's factor: dw += n * dout).
STRATA_HD float LayerNormNormalized(float x, float mean, float rstd) { return (x - mean) * rstd; }

STRATA_HD float LayerNormOut(float x, float mean, float rstd, float w, float b) {
  return LayerNormNormalized(x, mean, rstd) * w + b;
}

// With g = w * dout and n as above, per row: dx = rstd * (g - mean(g) - n * mean(g * n)).
// mean_g and mean_gn are RowMean of the row sums of g and g * n.
STRATA_HD float LayerNormDx(float x, float mean, float rstd, float w, float dout, float mean_g, float mean_gn) {
  return rstd * (w * dout - mean_g - LayerNormNormalized(x, mean, rstd) * mean_gn);
}

// ---- softmax cross-entropy, per row ----

STRATA_HD bool ValidTarget(int32_t target, int V) { return target >= 0 && target < V; }

// The softmax's normaliser from the double sum of exp(l - max): probs = exp(l - max) * inv.
STRATA_HD float SoftmaxInv(double sum_exp) { return static_cast<float>(1.0 / sum_exp); }

// loss = log(sum_j exp(l_j)) - l_t = log(sum_exp) - (l_t - max): finite even when probs[t] underflows.
// An invalid target carries NaN through target_logit.
STRATA_HD float CrossEntropyLoss(double sum_exp, float target_logit, float max_logit) {
  return static_cast<float>(log(sum_exp) - static_cast<double>(target_logit - max_logit));
}

// d(dloss * loss) / d logit_j = (p_j - [j == target]) * dloss.
STRATA_HD float CrossEntropyGrad(float p, bool is_target, float dloss) {
  return is_target ? (p - 1.0f) * dloss : p * dloss;
}

}  // namespace strata::kernels
