// The shared NN element math (models/gpt/nn/common/nn_math.h) against double-precision formulas written here:
// exp, GELU and its derivative (densely over [-12, 12], and the saturated tails up to the fp32 range,
// Inf and NaN), the LayerNorm pieces and the cross-entropy pieces. The same functions run inside the
// host kernels (models/gpt/nn/cpu/nn_ops.cc, nn_attention.cc) and the CUDA kernels (kernels/cuda), so these
// bounds hold for both.
//
// Bounds are stated from the operations each function performs: u = 2^-24 is the fp32 unit roundoff; an
// n-operation expression is held to a few u of the magnitude of its terms, with a margin of about 2x over
// the worst-case rounding count.
#include "models/gpt/nn/common/nn_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/models/gpt/nn/gelu_reference.h"

namespace strata::kernels {
namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
constexpr float kInf = std::numeric_limits<float>::infinity();

// ulps of |actual - expected| at expected's magnitude (fp32 spacing).
double UlpError(float actual, double expected) {
  const float e = static_cast<float>(expected);
  const double ulp = static_cast<double>(std::nextafter(e, kInf)) - e;
  return std::fabs(actual - expected) / ulp;
}

// ============================== exp ==============================

TEST(NnMathExp, WithinOneUlpOverTheNormalRangeAndExactAtTheEdges) {
  // Every softmax and GELU rests on Exp (Note [Vectorisable exp]): <= 1 ulp against exp in double over
  // [-87.33, 88.72] (Cephes' polynomial; observed max ~0.96), sampled densely.
  double worst = 0;
  float worst_x = 0;
  for (double xd = -87.33; xd <= 88.72; xd += 1.37e-4) {
    const float x = static_cast<float>(xd);
    const double err = UlpError(Exp(x), std::exp(static_cast<double>(x)));
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 1.0) << "worst at x = " << worst_x << ": " << Exp(worst_x) << " vs "
                        << std::exp(static_cast<double>(worst_x));
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-87.34f), 0.0f);  // below the smallest normal result: flushed
  EXPECT_EQ(Exp(-1e30f), 0.0f);
  EXPECT_EQ(Exp(-kInf), 0.0f);
  EXPECT_TRUE(std::isfinite(Exp(88.72f)));
  EXPECT_EQ(Exp(88.73f), kInf);
  EXPECT_EQ(Exp(kInf), kInf);
  EXPECT_TRUE(std::isnan(Exp(QuietNaN())));
  // A NaN payload must not leak into the exponent bits and come out as a number.
  for (uint32_t bits : {0x7fc00123u, 0xffc001ffu, 0x7f800001u}) {
    EXPECT_TRUE(std::isnan(Exp(BitsFloat(bits)))) << "NaN bits 0x" << std::hex << bits;
  }
}

// ============================== GELU ==============================

using testing::RefGelu;
using testing::RefGeluGrad;

TEST(NnMathGelu, MatchesTheTanhFormulaOverTheActiveRange) {
  // |error| <= 1e-6 * (1 + |x|), the bound the host kernel test holds GELU to: the logistic factor's
  // exponent -2u carries fp32 rounding of ~u * |2u| absolute, which exp turns into that much relative
  // error of s (~1e-6 at x = -6), and gelu = x s scales it by |x|. Observed: <= 0.1 of the bound.
  for (double xd = -12; xd <= 12; xd += 1.3e-4) {
    const float x = static_cast<float>(xd);
    const double tol = 1e-6 * (1 + std::fabs(x));
    ASSERT_NEAR(Gelu(x), RefGelu(x), tol) << "gelu at x " << x;
    ASSERT_NEAR(GeluGrad(x), RefGeluGrad(x), tol) << "gelu' at x " << x;
  }
  EXPECT_EQ(Gelu(0.0f), 0.0f);
  EXPECT_EQ(GeluGrad(0.0f), 0.5f);
}

TEST(NnMathGelu, SaturatedTailsAreExactOrNegligibleUpToTheFp32Range) {
  // Positive tail: exp(-2u) < 1e-38, so gelu(x) = x and gelu'(x) = 1 exactly, up to and including Inf
  // (x^3 overflows to Inf on the way, which must not turn into NaN).
  for (float x : {10.0f, 12.5f, 20.0f, 100.0f, 1e4f, 1e10f, 2e19f, 1e30f, 3e38f, kInf}) {
    EXPECT_EQ(Gelu(x), x) << "x " << x;
    EXPECT_EQ(GeluGrad(x), 1.0f) << "x " << x;
  }
  // Negative tail (past the exponent cap, x < ~-9.7): the true values are below 1e-30 (and 0 in double
  // for x < ~-27). gelu(x) = x e^-80 there (Note [GELU through the logistic]): relative to x it is
  // 1.8e-35; gelu'(x) is the clamped value at -10, ~4e-33 (kGeluGradClamp), never growing with |x|.
  for (float x : {-10.0f, -12.5f, -20.0f, -100.0f, -1e4f, -1e10f, -2e19f, -1e30f, -3e38f}) {
    EXPECT_LE(Gelu(x), 0.0f) << "x " << x;
    EXPECT_LE(std::fabs(Gelu(x)), 1.9e-35 * std::fabs(x)) << "x " << x;
    EXPECT_NEAR(RefGelu(x), 0.0, 1e-30) << "x " << x;
    EXPECT_LE(std::fabs(GeluGrad(x)), 1e-32) << "x " << x;
    EXPECT_NEAR(RefGeluGrad(x), 0.0, 1e-30) << "x " << x;
  }
  EXPECT_EQ(GeluGrad(-kInf), GeluGrad(-10.0f));
  EXPECT_TRUE(std::isnan(Gelu(QuietNaN())));
  EXPECT_TRUE(std::isnan(GeluGrad(QuietNaN())));
}

// ============================== LayerNorm ==============================

TEST(NnMathLayerNorm, RowPiecesMatchDoubleFormulas) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int C : {1, 7, 65, 768}) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    std::vector<float> x(C), w(C), b(C), dout(C);
    for (int j = 0; j < C; ++j) x[j] = dist(rng), w[j] = dist(rng), b[j] = dist(rng), dout[j] = dist(rng);
    // The row sums as the kernels would pass them (rounded to float); the pieces are judged on these.
    double sum = 0;
    for (float v : x) sum += v;
    const float mean = RowMean(static_cast<float>(sum), C);
    EXPECT_LE(UlpError(mean, static_cast<float>(sum) / static_cast<double>(C)), 0.5);
    double sq = 0;
    for (float v : x) sq += (v - static_cast<double>(mean)) * (v - static_cast<double>(mean));
    const float eps = 1e-5f;
    const float rstd = LayerNormRstd(static_cast<float>(sq), C, eps);
    // A division, an add, a sqrt and a reciprocal: <= 2 ulp.
    EXPECT_LE(UlpError(rstd, 1 / std::sqrt(static_cast<float>(sq) / static_cast<double>(C) + eps)), 2.0);

    double sum_g = 0, sum_gn = 0;
    for (int j = 0; j < C; ++j) {
      const double n = (x[j] - static_cast<double>(mean)) * rstd;
      // Four roundings (sub, mul, mul, add): 4u of |n w| + |b|, twice that as the bound.
      const double tol_out = 8 * kU * (std::fabs(n * w[j]) + std::fabs(b[j]));
      EXPECT_NEAR(LayerNormOut(x[j], mean, rstd, w[j], b[j]), n * w[j] + b[j], tol_out) << "j " << j;
      EXPECT_NEAR(LayerNormNormalized(x[j], mean, rstd), n, 4 * kU * std::fabs(n)) << "j " << j;
      sum_g += static_cast<double>(w[j]) * dout[j];
      sum_gn += static_cast<double>(w[j]) * dout[j] * n;
    }
    const float mean_g = RowMean(static_cast<float>(sum_g), C);
    const float mean_gn = RowMean(static_cast<float>(sum_gn), C);
    for (int j = 0; j < C; ++j) {
      const double n = (x[j] - static_cast<double>(mean)) * rstd;
      const double g = static_cast<double>(w[j]) * dout[j];
      const double want = rstd * (g - mean_g - n * mean_gn);
      // Seven roundings over terms of magnitude |g| + |mean_g| + |n mean_gn|, scaled by rstd: 16u of that.
      const double tol = 16 * kU * rstd * (std::fabs(g) + std::fabs(mean_g) + std::fabs(n * mean_gn));
      EXPECT_NEAR(LayerNormDx(x[j], mean, rstd, w[j], dout[j], mean_g, mean_gn), want, tol) << "j " << j;
    }
  }
}

// ============================== cross-entropy ==============================

TEST(NnMathCrossEntropy, LossAndGradientPiecesMatchDoubleFormulas) {
  EXPECT_FALSE(ValidTarget(-1, 5));
  EXPECT_TRUE(ValidTarget(0, 5));
  EXPECT_TRUE(ValidTarget(4, 5));
  EXPECT_FALSE(ValidTarget(5, 5));

  std::mt19937 rng(9);
  std::uniform_real_distribution<double> sums(1.0, 5e4);
  std::uniform_real_distribution<float> logits(-300.0f, 300.0f), probs(0.0f, 1.0f);
  for (int i = 0; i < 1000; ++i) {
    const double sum_exp = sums(rng);  // >= 1: the max term is exp(0)
    const float max_logit = logits(rng), target_logit = std::min(max_logit, logits(rng));
    const double want = std::log(sum_exp) - (static_cast<double>(target_logit) - max_logit);
    // One float subtraction (u of |l_t - max|), then one rounding of the double result to float.
    const double tol = kU * (std::fabs(static_cast<double>(target_logit) - max_logit) + std::fabs(want)) * 2;
    EXPECT_NEAR(CrossEntropyLoss(sum_exp, target_logit, max_logit), want, tol) << "i " << i;
    EXPECT_LE(UlpError(SoftmaxInv(sum_exp), 1.0 / sum_exp), 0.5) << "i " << i;

    const float p = probs(rng), dloss = probs(rng);
    // Two roundings each: (p - 1) then * dloss; p * dloss.
    EXPECT_NEAR(CrossEntropyGrad(p, true, dloss), (p - 1.0) * dloss, 2 * kU * std::fabs(p - 1.0) * dloss);
    EXPECT_LE(UlpError(CrossEntropyGrad(p, false, dloss), static_cast<double>(p) * dloss), 0.5);
  }
  // An invalid target's NaN logit makes the loss NaN; a target probability of 1 gives a zero gradient.
  EXPECT_TRUE(std::isnan(CrossEntropyLoss(10.0, QuietNaN(), 1.0f)));
  EXPECT_EQ(CrossEntropyLoss(1.0, 3.0f, 3.0f), 0.0f);
  EXPECT_EQ(CrossEntropyGrad(1.0f, true, 0.5f), 0.0f);
}

}  // namespace
}  // namespace strata::kernels
