// Every kernel of models/gpt/nn/cpu/nn.h against a double-precision reference written here, independently of
// the kernels (no shared code; backward references are derived per element rather than by the kernels'
// factorisations), on random inputs of awkward sizes. The references of LayerNorm, GELU, attention and
// cross-entropy are themselves checked against central finite differences, so the oracle is trusted.
//
// Tolerances: the kernels compute in fp32 (unit roundoff u = 6e-8), the references in double. Unless a
// check says otherwise, |actual - expected| <= rtol * scale, where scale is the largest |expected| of
// that output (its natural magnitude; an element near zero after cancellation is judged against the
// scale of the terms that cancelled, not against itself). Each rtol below states the fp32 error it
// expects on these sizes and the margin over what was observed.
//
// The shared per-element math underneath (exp, GELU, LayerNorm and cross-entropy pieces, kernels/common/
// nn_math.h) is checked on its own in tests/models/gpt/nn/common/nn_math_test.cc.
//
// The accumulate contract is checked by pre-filling: accumulated outputs start from random values and
// must equal prefill + gradient; written outputs start as NaN ("garbage") and must hold no trace of it.
#include "models/gpt/nn/cpu/nn.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/models/gpt/nn/gelu_reference.h"

namespace strata::kernels::cpu {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

constexpr float kGarbage = std::numeric_limits<float>::quiet_NaN();

// fp32 products of at most 33 terms: error <= ~33 u * sum|a||w| = 2e-6 * sum|a||w|, and sum|a||w| is
// within a few times the output scale for these random inputs. Observed: <= 1.4e-6 of scale (a lone
// 33-term output that partly cancels), so 1e-5 leaves 7x.
constexpr double kMatmulRtol = 1e-5;
// Row-wise kernels and attention over rows of <= 131 (sums, exp/sqrt at ~1 ulp, short products; the
// attention backward chains three products and a softmax backward): observed <= 3.2e-7 of scale, so
// 1e-5 leaves 30x.
constexpr double kRowRtol = 1e-5;
// Finite differences of the double references with step 1e-6: truncation ~1e-12 and rounding
// ~1e-16 / 1e-6 * |L|, far below 1e-6 of the gradient scale.
constexpr double kFdRtol = 1e-6;
constexpr double kFdStep = 1e-6;

Vec RandomVec(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

DVec ToDouble(const Vec& v) { return DVec(v.begin(), v.end()); }

// prefill + delta: what an accumulated output must hold.
DVec Plus(const Vec& prefill, const DVec& delta) {
  DVec r(delta.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = prefill[i] + delta[i];
  return r;
}

double Dot(const DVec& a, const DVec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// |actual[i] - expected[i]| <= rtol * max(max_j |expected[j]|, min_scale) for every i; NaN fails.
// A failure lists the first mismatches with index, expected and actual.
template <typename Actual>
::testing::AssertionResult AllClose(const std::string& what, const Actual& actual, const DVec& expected, double rtol,
                                    double min_scale = 1e-30) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << what << ": size " << actual.size() << " != " << expected.size();
  }
  double scale = min_scale;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  const double tol = rtol * scale;
  std::ostringstream msg;
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    const double err = std::fabs(a - expected[i]);
    if (!(err <= tol)) {
      if (bad < 8) {
        msg << "\n  " << what << "[" << i << "]: expected " << expected[i] << ", actual " << a << ", |diff| " << err
            << " > tol " << tol;
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << expected.size()
                                       << " elements off (scale " << scale << ", rtol " << rtol << ")" << msg.str();
}

// Central differences of f at every entry of x.
DVec FiniteDiff(DVec x, const std::function<double(const DVec&)>& f) {
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kFdStep;
    const double fp = f(x);
    x[i] = saved - kFdStep;
    const double fm = f(x);
    x[i] = saved;
    g[i] = (fp - fm) / (2 * kFdStep);
  }
  return g;
}

// ============================== matrix products ==============================

const int kDims[] = {1, 7, 33};

// out[M,N] = a[M,K] @ w[K,N] (+ bias)
DVec RefMatmul(const Vec& a, const Vec& w, const float* bias, int M, int K, int N) {
  DVec out(static_cast<size_t>(M) * N);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = bias ? bias[j] : 0.0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(a[i * K + k]) * w[k * N + j];
      out[i * N + j] = s;
    }
  }
  return out;
}

TEST(Matmul, ForwardMatchesReferenceOverAwkwardShapes) {
  std::mt19937 rng(1);
  for (int M : kDims) {
    for (int K : kDims) {
      for (int N : kDims) {
        for (bool with_bias : {false, true}) {
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " bias=" << with_bias
                                              << " accumulate=" << accumulate);
            const Vec a = RandomVec(M * K, rng), w = RandomVec(K * N, rng), bias = RandomVec(N, rng);
            const Vec prefill = accumulate ? RandomVec(M * N, rng) : Vec(M * N, kGarbage);
            Vec out = prefill;
            MatmulForward(a.data(), w.data(), with_bias ? bias.data() : nullptr, out.data(), M, K, N, accumulate);
            DVec expected = RefMatmul(a, w, with_bias ? bias.data() : nullptr, M, K, N);
            if (accumulate) expected = Plus(prefill, expected);
            EXPECT_TRUE(AllClose("out", out, expected, kMatmulRtol));
          }
        }
      }
    }
  }
}

TEST(Matmul, BackwardWritesDaAccumulatesDwDbiasAndSkipsNull) {
  std::mt19937 rng(2);
  for (int M : kDims) {
    for (int K : kDims) {
      for (int N : kDims) {
        SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N);
        const Vec a = RandomVec(M * K, rng), w = RandomVec(K * N, rng), dout = RandomVec(M * N, rng);
        DVec ref_da(M * K, 0.0), ref_dw(K * N, 0.0), ref_db(N, 0.0);
        for (int i = 0; i < M; ++i) {
          for (int j = 0; j < N; ++j) {
            const double g = dout[i * N + j];
            ref_db[j] += g;
            for (int k = 0; k < K; ++k) {
              ref_da[i * K + k] += g * w[k * N + j];
              ref_dw[k * N + j] += g * a[i * K + k];
            }
          }
        }
        Vec da(M * K, kGarbage);
        const Vec dw0 = RandomVec(K * N, rng), db0 = RandomVec(N, rng);
        Vec dw = dw0, db = db0;
        MatmulBackward(dout.data(), a.data(), w.data(), da.data(), dw.data(), db.data(), M, K, N);
        EXPECT_TRUE(AllClose("da", da, ref_da, kMatmulRtol));
        EXPECT_TRUE(AllClose("dw", dw, Plus(dw0, ref_dw), kMatmulRtol));
        EXPECT_TRUE(AllClose("dbias", db, Plus(db0, ref_db), kMatmulRtol));

        // Null outputs are skipped: only dw is asked for, and it accumulates a second time.
        MatmulBackward(dout.data(), a.data(), w.data(), nullptr, dw.data(), nullptr, M, K, N);
        DVec twice = Plus(dw0, ref_dw);
        for (size_t i = 0; i < twice.size(); ++i) twice[i] += ref_dw[i];
        EXPECT_TRUE(AllClose("dw after second call", dw, twice, kMatmulRtol));
      }
    }
  }
}

TEST(Matmul, EmptyInnerDimensionWritesBiasOrZeroOverGarbage) {
  const int M = 3, N = 4;
  const Vec bias = {1, -2, 3, -4};
  Vec out(M * N, kGarbage);
  MatmulForward(nullptr, nullptr, bias.data(), out.data(), M, 0, N);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(out[i], bias[i % N]) << "index " << i;
  std::fill(out.begin(), out.end(), kGarbage);
  MatmulForward(nullptr, nullptr, nullptr, out.data(), M, 0, N);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(out[i], 0.0f) << "index " << i;
  // da[M,K] = dout[M,0] @ w[K,0]^T is a product of no terms: zero, written over garbage.
  Vec da(M * 2, kGarbage);
  MatmulBackward(nullptr, nullptr, nullptr, da.data(), nullptr, nullptr, M, 2, 0);
  for (size_t i = 0; i < da.size(); ++i) EXPECT_EQ(da[i], 0.0f) << "index " << i;
  // No rows: nothing to add to dw or dbias.
  Vec dw = {5, 6}, db = {7, 8};
  MatmulBackward(nullptr, nullptr, nullptr, nullptr, dw.data(), db.data(), 0, 1, 2);
  EXPECT_EQ(dw, (Vec{5, 6}));
  EXPECT_EQ(db, (Vec{7, 8}));
}

TEST(MatmulTransB, ForwardAndBackwardMatchReferenceOverAwkwardShapes) {
  std::mt19937 rng(3);
  for (int M : kDims) {
    for (int K : kDims) {
      for (int N : kDims) {
        SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N);
        const Vec a = RandomVec(M * K, rng), b = RandomVec(N * K, rng), dout = RandomVec(M * N, rng);
        DVec ref_out(M * N, 0.0), ref_da(M * K, 0.0), ref_db(N * K, 0.0);
        for (int i = 0; i < M; ++i) {
          for (int j = 0; j < N; ++j) {
            for (int k = 0; k < K; ++k) {
              ref_out[i * N + j] += static_cast<double>(a[i * K + k]) * b[j * K + k];
              ref_da[i * K + k] += static_cast<double>(dout[i * N + j]) * b[j * K + k];
              ref_db[j * K + k] += static_cast<double>(dout[i * N + j]) * a[i * K + k];
            }
          }
        }
        Vec out(M * N, kGarbage), da(M * K, kGarbage);
        const Vec db0 = RandomVec(N * K, rng);
        Vec db = db0;
        MatmulTransBForward(a.data(), b.data(), out.data(), M, K, N);
        MatmulTransBBackward(dout.data(), a.data(), b.data(), da.data(), db.data(), M, K, N);
        EXPECT_TRUE(AllClose("out", out, ref_out, kMatmulRtol));
        EXPECT_TRUE(AllClose("da", da, ref_da, kMatmulRtol));
        EXPECT_TRUE(AllClose("db", db, Plus(db0, ref_db), kMatmulRtol));
      }
    }
  }
}

// ============================== LayerNorm ==============================

struct LnRef {
  DVec out, mean, rstd;
};

LnRef RefLayerNorm(const DVec& x, const DVec& w, const DVec& b, int N, int C, double eps) {
  LnRef r{DVec(x.size()), DVec(N), DVec(N)};
  for (int i = 0; i < N; ++i) {
    double mean = 0, var = 0;
    for (int j = 0; j < C; ++j) mean += x[i * C + j];
    mean /= C;
    for (int j = 0; j < C; ++j) var += (x[i * C + j] - mean) * (x[i * C + j] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int j = 0; j < C; ++j) r.out[i * C + j] = (x[i * C + j] - mean) * rstd * w[j] + b[j];
    r.mean[i] = mean;
    r.rstd[i] = rstd;
  }
  return r;
}

struct LnGrads {
  DVec dx, dw, db;
};

// Through the full Jacobian of the normalisation: d n_j / d x_k = rstd (delta_jk - 1/C - n_j n_k / C).
LnGrads RefLayerNormBackward(const DVec& dout, const DVec& x, const DVec& w, int N, int C, double eps) {
  const LnRef fwd = RefLayerNorm(x, w, DVec(C, 0.0), N, C, eps);
  LnGrads g{DVec(x.size(), 0.0), DVec(C, 0.0), DVec(C, 0.0)};
  for (int i = 0; i < N; ++i) {
    const double rstd = fwd.rstd[i];
    auto n = [&](int j) { return (x[i * C + j] - fwd.mean[i]) * rstd; };
    for (int j = 0; j < C; ++j) {
      g.db[j] += dout[i * C + j];
      g.dw[j] += dout[i * C + j] * n(j);
      for (int k = 0; k < C; ++k) {
        const double jac = rstd * ((j == k ? 1.0 : 0.0) - 1.0 / C - n(j) * n(k) / C);
        g.dx[i * C + k] += dout[i * C + j] * w[j] * jac;
      }
    }
  }
  return g;
}

struct RowShape {
  int B, T, C;
};
const RowShape kRowShapes[] = {{2, 5, 12}, {2, 1, 12}, {1, 3, 37}, {3, 2, 1}};

TEST(LayerNormReference, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(10);
  const int N = 4, C = 7;
  const double eps = 1e-5;
  const DVec x = ToDouble(RandomVec(N * C, rng)), w = ToDouble(RandomVec(C, rng)), b = ToDouble(RandomVec(C, rng));
  const DVec dout = ToDouble(RandomVec(N * C, rng));
  const LnGrads g = RefLayerNormBackward(dout, x, w, N, C, eps);
  // L = <dout, LayerNorm(x; w, b)>, differentiated in each argument.
  auto loss = [&](const DVec& xx, const DVec& ww, const DVec& bb) {
    return Dot(dout, RefLayerNorm(xx, ww, bb, N, C, eps).out);
  };
  const DVec fd_x = FiniteDiff(x, [&](const DVec& v) { return loss(v, w, b); });
  const DVec fd_w = FiniteDiff(w, [&](const DVec& v) { return loss(x, v, b); });
  const DVec fd_b = FiniteDiff(b, [&](const DVec& v) { return loss(x, w, v); });
  EXPECT_TRUE(AllClose("dx", g.dx, fd_x, kFdRtol));
  EXPECT_TRUE(AllClose("dw", g.dw, fd_w, kFdRtol));
  EXPECT_TRUE(AllClose("db", g.db, fd_b, kFdRtol));
}

TEST(LayerNorm, ForwardAndBackwardMatchReferenceAndAccumulate) {
  std::mt19937 rng(11);
  for (const RowShape& s : kRowShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const int N = s.B * s.T, C = s.C;
    const Vec x = RandomVec(N * C, rng, -2, 2), w = RandomVec(C, rng), b = RandomVec(C, rng);
    const Vec dout = RandomVec(N * C, rng);
    Vec out(N * C, kGarbage), mean(N, kGarbage), rstd(N, kGarbage);
    LayerNormForward(x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data(), N, C);
    const LnRef ref = RefLayerNorm(ToDouble(x), ToDouble(w), ToDouble(b), N, C, 1e-5);
    EXPECT_TRUE(AllClose("out", out, ref.out, kRowRtol));
    EXPECT_TRUE(AllClose("mean", mean, ref.mean, kRowRtol, /*min_scale=*/1.0));  // |x| <= 2: judge on 1
    EXPECT_TRUE(AllClose("rstd", rstd, ref.rstd, kRowRtol));

    const Vec dx0 = RandomVec(N * C, rng), dw0 = RandomVec(C, rng), db0 = RandomVec(C, rng);
    Vec dx = dx0, dw = dw0, db = db0;
    LayerNormBackward(dout.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N,
                      C);
    const LnGrads g = RefLayerNormBackward(ToDouble(dout), ToDouble(x), ToDouble(w), N, C, 1e-5);
    // Accumulated onto random pre-fills: the expected value is prefill + gradient, judged on that scale.
    EXPECT_TRUE(AllClose("dx", dx, Plus(dx0, g.dx), kRowRtol));
    EXPECT_TRUE(AllClose("dw", dw, Plus(dw0, g.dw), kRowRtol));
    EXPECT_TRUE(AllClose("db", db, Plus(db0, g.db), kRowRtol));
  }
}

TEST(LayerNorm, StaysAccurateWhenTheMeanDwarfsTheSpread) {
  // x = 300 + U(-1, 1): a one-pass E[x^2] - E[x]^2 in fp32 would lose the variance (x^2 ~ 9e4, its
  // rounding ~5e-3, the variance ~0.33) to O(10%) errors. The two-pass kernel is limited by the fp32
  // mean: at worst ~C u 300 = 7e-4 absolute against a unit spread (observed ~2e-5), so out and rstd are
  // held to 1e-3 of scale.
  std::mt19937 rng(12);
  const int N = 6, C = 37;
  Vec x = RandomVec(N * C, rng);
  for (float& v : x) v += 300.0f;
  const Vec w = RandomVec(C, rng), b = RandomVec(C, rng);
  Vec out(N * C), mean(N), rstd(N);
  LayerNormForward(x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data(), N, C);
  const LnRef ref = RefLayerNorm(ToDouble(x), ToDouble(w), ToDouble(b), N, C, 1e-5);
  EXPECT_TRUE(AllClose("out", out, ref.out, 1e-3));
  EXPECT_TRUE(AllClose("rstd", rstd, ref.rstd, 1e-3));
  EXPECT_TRUE(AllClose("mean", mean, ref.mean, 1e-6));
}

// ============================== GELU ==============================

using kernels::testing::RefGelu;
using kernels::testing::RefGeluGrad;

TEST(GeluReference, DerivativeMatchesFiniteDifferences) {
  for (double x = -6; x <= 6; x += 0.37) {
    const double fd = (RefGelu(x + kFdStep) - RefGelu(x - kFdStep)) / (2 * kFdStep);
    EXPECT_NEAR(RefGeluGrad(x), fd, kFdRtol) << "x " << x;
  }
}

TEST(Gelu, ForwardAndBackwardMatchReferenceIncludingSaturation) {
  std::mt19937 rng(20);
  Vec x = RandomVec(1001, rng, -6, 6);
  // Zeros, tiny, saturated, and either side of the kernel's exponent cap (x ~ -9.4).
  for (float v : {0.0f, -0.0f, 1e-20f, 20.0f, -20.0f, 100.0f, -100.0f, -9.3f, -9.5f}) x.push_back(v);
  const size_t n = x.size();
  const Vec dout = RandomVec(n, rng);
  Vec out(n, kGarbage), dx(n, kGarbage);
  GeluForward(x.data(), out.data(), n);
  GeluBackward(x.data(), dout.data(), dx.data(), n);
  // Per element, |error| <= 1e-6 * (1 + |x|): the sigmoid factor is good to a few ulp and gelu ~ x s
  // scales its error by |x| (observed: <= 0.1 of this bound over [-12, 12]).
  for (size_t i = 0; i < n; ++i) {
    const double tol = 1e-6 * (1 + std::fabs(x[i]));
    EXPECT_NEAR(out[i], RefGelu(x[i]), tol) << "out index " << i << " x " << x[i];
    EXPECT_NEAR(dx[i], dout[i] * RefGeluGrad(x[i]), tol) << "dx index " << i << " x " << x[i];
  }
}

// ============================== attention ==============================

struct AttnShape {
  int B, T, C, NH;
};
// T = 131 spans three of the kernel's 64-row query blocks, the last one partial.
const AttnShape kAttnShapes[] = {{2, 5, 12, 3}, {2, 1, 12, 3}, {1, 131, 8, 2}, {1, 7, 6, 1}};

struct AttnRef {
  DVec out, att;
};

double Qkv(const DVec& qkv, const AttnShape& s, int b, int t, int part, int h, int d) {
  const int hs = s.C / s.NH;
  return qkv[(static_cast<size_t>(b) * s.T + t) * 3 * s.C + part * s.C + h * hs + d];
}

AttnRef RefAttention(const DVec& qkv, const AttnShape& s) {
  const int hs = s.C / s.NH, T = s.T;
  const double scale = 1 / std::sqrt(static_cast<double>(hs));
  AttnRef r{DVec(static_cast<size_t>(s.B) * T * s.C, 0.0), DVec(static_cast<size_t>(s.B) * s.NH * T * T, 0.0)};
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < T; ++t) {
        DVec score(t + 1);
        double mx = -INFINITY, z = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += Qkv(qkv, s, b, t, 0, h, d) * Qkv(qkv, s, b, t2, 1, h, d);
          score[t2] = dot * scale;
          mx = std::max(mx, score[t2]);
        }
        for (int t2 = 0; t2 <= t; ++t2) z += std::exp(score[t2] - mx);
        double* att_row = &r.att[((static_cast<size_t>(b) * s.NH + h) * T + t) * T];
        for (int t2 = 0; t2 <= t; ++t2) {
          att_row[t2] = std::exp(score[t2] - mx) / z;
          for (int d = 0; d < hs; ++d) {
            r.out[(static_cast<size_t>(b) * T + t) * s.C + h * hs + d] += att_row[t2] * Qkv(qkv, s, b, t2, 2, h, d);
          }
        }
      }
    }
  }
  return r;
}

// d qkv of L = <dout, out>, element by element through scores s, probabilities p and out = p v.
DVec RefAttentionBackward(const DVec& dout, const DVec& qkv, const AttnShape& s) {
  const int hs = s.C / s.NH, T = s.T;
  const double scale = 1 / std::sqrt(static_cast<double>(hs));
  const DVec att = RefAttention(qkv, s).att;
  DVec dqkv(qkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h, int d) -> double& {
    return dqkv[(static_cast<size_t>(b) * T + t) * 3 * s.C + part * s.C + h * hs + d];
  };
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const double* p = &att[((static_cast<size_t>(b) * s.NH + h) * T + t) * T];
        const double* g = &dout[(static_cast<size_t>(b) * T + t) * s.C + h * hs];
        DVec dp(t + 1, 0.0);
        for (int t2 = 0; t2 <= t; ++t2) {
          for (int d = 0; d < hs; ++d) {
            dp[t2] += g[d] * Qkv(qkv, s, b, t2, 2, h, d);  // d out / d p
            at(b, t2, 2, h, d) += p[t2] * g[d];            // d out / d v
          }
        }
        // d p_i / d s_j = p_i (delta_ij - p_j)
        for (int j = 0; j <= t; ++j) {
          double ds = 0;
          for (int i = 0; i <= t; ++i) ds += dp[i] * p[i] * ((i == j ? 1.0 : 0.0) - p[j]);
          for (int d = 0; d < hs; ++d) {
            at(b, t, 0, h, d) += ds * scale * Qkv(qkv, s, b, j, 1, h, d);
            at(b, j, 1, h, d) += ds * scale * Qkv(qkv, s, b, t, 0, h, d);
          }
        }
      }
    }
  }
  return dqkv;
}

TEST(AttentionReference, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(30);
  for (const AttnShape& s : {AttnShape{2, 4, 6, 2}, AttnShape{1, 1, 4, 2}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const DVec qkv = ToDouble(RandomVec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng, -2, 2));
    const DVec dout = ToDouble(RandomVec(static_cast<size_t>(s.B) * s.T * s.C, rng));
    const DVec fd = FiniteDiff(qkv, [&](const DVec& v) { return Dot(dout, RefAttention(v, s).out); });
    EXPECT_TRUE(AllClose("dqkv", RefAttentionBackward(dout, qkv, s), fd, kFdRtol));
  }
}

TEST(Attention, ForwardAndBackwardMatchReferenceAndOverwriteGarbage) {
  std::mt19937 rng(31);
  for (const AttnShape& s : kAttnShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
    const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    const Vec qkv = RandomVec(n_qkv, rng, -2, 2), dout = RandomVec(n_out, rng);
    Vec out(n_out, kGarbage), att(n_att, kGarbage), dqkv(n_qkv, kGarbage), datt(n_att, kGarbage);
    AttentionForward(qkv.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH);
    AttentionBackward(dout.data(), qkv.data(), att.data(), dqkv.data(), datt.data(), s.B, s.T, s.C, s.NH);
    const AttnRef ref = RefAttention(ToDouble(qkv), s);
    // Probabilities are in [0, 1]: judged against 1 (rows of one token are exactly 1).
    EXPECT_TRUE(AllClose("att", att, ref.att, kRowRtol, /*min_scale=*/1.0));
    EXPECT_TRUE(AllClose("out", out, ref.out, kRowRtol));
    EXPECT_TRUE(AllClose("dqkv", dqkv, RefAttentionBackward(ToDouble(dout), ToDouble(qkv), s), kRowRtol));
  }
}

TEST(Attention, LargeScoresStayFiniteAndAccurate) {
  // q, k in [-12, 12] with head size 4 give scores up to ~290: exp overflows fp32 without the row max
  // subtracted. The scores themselves carry fp32 rounding of up to ~u * 290 = 2e-5 absolute, which exp
  // turns into up to ~2e-5 relative error of the probabilities (observed: ~2e-6 of scale); 1e-4 of scale.
  std::mt19937 rng(33);
  const AttnShape s{2, 9, 8, 2};
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  const Vec qkv = RandomVec(n_qkv, rng, -12, 12), dout = RandomVec(n_out, rng);
  Vec out(n_out, kGarbage), att(n_att, kGarbage), dqkv(n_qkv, kGarbage), datt(n_att, kGarbage);
  AttentionForward(qkv.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH);
  AttentionBackward(dout.data(), qkv.data(), att.data(), dqkv.data(), datt.data(), s.B, s.T, s.C, s.NH);
  const AttnRef ref = RefAttention(ToDouble(qkv), s);
  EXPECT_TRUE(AllClose("att", att, ref.att, 1e-4, /*min_scale=*/1.0));
  EXPECT_TRUE(AllClose("out", out, ref.out, 1e-4));
  EXPECT_TRUE(AllClose("dqkv", dqkv, RefAttentionBackward(ToDouble(dout), ToDouble(qkv), s), 1e-4));
}

TEST(Attention, CausalMaskIsExactAndLaterTokensDoNotLeak) {
  std::mt19937 rng(32);
  const AttnShape s{2, 131, 8, 2};
  const int T = s.T;
  const size_t n_qkv = static_cast<size_t>(s.B) * T * 3 * s.C, n_out = static_cast<size_t>(s.B) * T * s.C;
  const size_t n_att = static_cast<size_t>(s.B) * s.NH * T * T;
  const Vec qkv = RandomVec(n_qkv, rng, -2, 2);
  Vec out(n_out, kGarbage), att(n_att, kGarbage);
  AttentionForward(qkv.data(), out.data(), att.data(), s.B, T, s.C, s.NH);
  for (size_t row = 0; row < n_att / T; ++row) {
    const int t = static_cast<int>(row % T);
    for (int t2 = t + 1; t2 < T; ++t2) {
      ASSERT_EQ(att[row * T + t2], 0.0f) << "att row " << row << " (t=" << t << "), t2=" << t2;
    }
  }
  // Replace every token after t0 (q, k and v, in every batch row) and rerun: rows <= t0 of out and att
  // must be bitwise unchanged. t0 sits inside, at the end of and just past the 64-row query blocks.
  for (int t0 : {0, 3, 63, 64, 100, 129}) {
    SCOPED_TRACE(::testing::Message() << "t0=" << t0);
    Vec qkv2 = qkv;
    const Vec fresh = RandomVec(n_qkv, rng, -5, 5);
    for (int b = 0; b < s.B; ++b) {
      for (size_t i = (static_cast<size_t>(b) * T + t0 + 1) * 3 * s.C; i < (static_cast<size_t>(b) + 1) * T * 3 * s.C;
           ++i) {
        qkv2[i] = fresh[i];
      }
    }
    Vec out2(n_out, kGarbage), att2(n_att, kGarbage);
    AttentionForward(qkv2.data(), out2.data(), att2.data(), s.B, T, s.C, s.NH);
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t <= t0; ++t) {
        for (int c = 0; c < s.C; ++c) {
          const size_t i = (static_cast<size_t>(b) * T + t) * s.C + c;
          ASSERT_EQ(out2[i], out[i]) << "out index " << i << " (b=" << b << " t=" << t << " c=" << c << ")";
        }
      }
      for (int h = 0; h < s.NH; ++h) {
        for (int t = 0; t <= t0; ++t) {
          for (int t2 = 0; t2 < T; ++t2) {
            const size_t i = ((static_cast<size_t>(b) * s.NH + h) * T + t) * T + t2;
            ASSERT_EQ(att2[i], att[i]) << "att index " << i << " (b=" << b << " h=" << h << " t=" << t << ")";
          }
        }
      }
    }
  }
}

// ============================== cross-entropy ==============================

struct CeRef {
  DVec probs, losses;
  double mean;
};

CeRef RefCrossEntropy(const DVec& logits, const std::vector<int32_t>& targets, int N, int V) {
  CeRef r{DVec(logits.size()), DVec(N), 0.0};
  for (int i = 0; i < N; ++i) {
    const double* l = &logits[static_cast<size_t>(i) * V];
    const double mx = *std::max_element(l, l + V);
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(l[j] - mx);
    for (int j = 0; j < V; ++j) r.probs[i * V + j] = std::exp(l[j] - mx) / z;
    r.losses[i] = mx + std::log(z) - l[targets[i]];
    r.mean += r.losses[i] / N;
  }
  return r;
}

// d (dloss * sum_i loss_i) / d logits = dloss * (p - onehot(target)).
DVec RefCrossEntropyBackward(const DVec& probs, const std::vector<int32_t>& targets, double dloss, int N, int V) {
  DVec d(probs.size());
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < V; ++j) d[i * V + j] = dloss * (probs[i * V + j] - (j == targets[i] ? 1.0 : 0.0));
  }
  return d;
}

std::vector<int32_t> RandomTargets(int N, int V, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(N);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

TEST(CrossEntropyReference, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(40);
  const int N = 3, V = 11;
  const DVec logits = ToDouble(RandomVec(N * V, rng, -3, 3));
  const std::vector<int32_t> targets = RandomTargets(N, V, rng);
  const double dloss = 1.0 / N;
  const DVec grad = RefCrossEntropyBackward(RefCrossEntropy(logits, targets, N, V).probs, targets, dloss, N, V);
  const DVec fd = FiniteDiff(logits, [&](const DVec& v) { return RefCrossEntropy(v, targets, N, V).mean; });
  EXPECT_TRUE(AllClose("dlogits", grad, fd, kFdRtol));
}

TEST(CrossEntropy, ForwardAndBackwardMatchReferenceAndOverwriteGarbage) {
  std::mt19937 rng(41);
  const int V = 37;
  for (int N : {10, 2, 1}) {  // B*T for (2,5), (2,1), (1,1)
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V);
    const Vec logits = RandomVec(N * V, rng, -4, 4);
    const std::vector<int32_t> targets = RandomTargets(N, V, rng);
    Vec probs(N * V, kGarbage), losses(N, kGarbage), dlogits(N * V, kGarbage);
    const double mean = CrossEntropyForward(logits.data(), targets.data(), probs.data(), losses.data(), N, V);
    CrossEntropyBackward(probs.data(), targets.data(), dlogits.data(), 1.0f / N, N, V);
    const CeRef ref = RefCrossEntropy(ToDouble(logits), targets, N, V);
    EXPECT_TRUE(AllClose("probs", probs, ref.probs, kRowRtol, /*min_scale=*/1.0));
    EXPECT_TRUE(AllClose("losses", losses, ref.losses, kRowRtol));
    EXPECT_NEAR(mean, ref.mean, kRowRtol * ref.mean) << "mean loss";
    EXPECT_TRUE(AllClose("dlogits", dlogits, RefCrossEntropyBackward(ref.probs, targets, 1.0 / N, N, V), kRowRtol));
  }
}

TEST(CrossEntropy, HugeLogitSpreadStaysFinite) {
  // Logits in [-200, 400] and the target often far below the max: exp overflows without the max
  // subtraction and probs[target] underflows to 0 in fp32, so -log(probs[target]) would be inf;
  // log-sum-exp keeps the loss finite and exact to fp32 relative precision.
  std::mt19937 rng(42);
  const int N = 8, V = 37;
  const Vec logits = RandomVec(N * V, rng, -200, 400);
  const std::vector<int32_t> targets = RandomTargets(N, V, rng);
  Vec probs(N * V), losses(N), dlogits(N * V);
  CrossEntropyForward(logits.data(), targets.data(), probs.data(), losses.data(), N, V);
  CrossEntropyBackward(probs.data(), targets.data(), dlogits.data(), 1.0f, N, V);
  const CeRef ref = RefCrossEntropy(ToDouble(logits), targets, N, V);
  for (int i = 0; i < N; ++i) {
    EXPECT_TRUE(std::isfinite(losses[i])) << "row " << i;
    EXPECT_NEAR(losses[i], ref.losses[i], 1e-6 * std::max(1.0, ref.losses[i])) << "row " << i;
  }
  EXPECT_TRUE(AllClose("probs", probs, ref.probs, kRowRtol, 1.0));
  EXPECT_TRUE(AllClose("dlogits", dlogits, RefCrossEntropyBackward(ref.probs, targets, 1.0, N, V), kRowRtol));
}

TEST(CrossEntropy, OutOfRangeTargetPoisonsOnlyItsRow) {
  const int N = 3, V = 5;
  const Vec logits = {0, 1, 2, 3, 4, 1, 1, 1, 1, 1, 4, 3, 2, 1, 0};
  const std::vector<int32_t> targets = {2, V, -1};
  Vec probs(N * V), losses(N), dlogits(N * V);
  const double mean = CrossEntropyForward(logits.data(), targets.data(), probs.data(), losses.data(), N, V);
  CrossEntropyBackward(probs.data(), targets.data(), dlogits.data(), 1.0f, N, V);
  EXPECT_NEAR(losses[0], RefCrossEntropy(ToDouble(logits), {2, 0, 0}, N, V).losses[0], 1e-6);
  EXPECT_TRUE(std::isnan(losses[1]));
  EXPECT_TRUE(std::isnan(losses[2]));
  EXPECT_TRUE(std::isnan(mean));
  for (int j = 0; j < V; ++j) {
    EXPECT_FALSE(std::isnan(dlogits[j])) << "row 0 index " << j;
    EXPECT_TRUE(std::isnan(dlogits[V + j])) << "row 1 index " << j;
    EXPECT_NEAR(probs[V + j], 0.2f, 1e-7) << "probs are still computed for a bad row, index " << j;
  }
}

TEST(CrossEntropy, RunsInPlaceOnTheLogitsBuffer) {
  // probs == logits and dlogits == probs (Note [Cross-entropy in place]) must give what separate
  // buffers give, bit for bit.
  std::mt19937 rng(43);
  const int N = 4, V = 37;
  const Vec logits = RandomVec(N * V, rng, -4, 4);
  const std::vector<int32_t> targets = RandomTargets(N, V, rng);
  Vec probs(N * V), losses(N), dlogits(N * V);
  const double mean = CrossEntropyForward(logits.data(), targets.data(), probs.data(), losses.data(), N, V);
  CrossEntropyBackward(probs.data(), targets.data(), dlogits.data(), 0.25f, N, V);
  Vec buf = logits, losses2(N);
  const double mean2 = CrossEntropyForward(buf.data(), targets.data(), buf.data(), losses2.data(), N, V);
  EXPECT_EQ(buf, probs);
  EXPECT_EQ(losses2, losses);
  EXPECT_EQ(mean2, mean);
  CrossEntropyBackward(buf.data(), targets.data(), buf.data(), 0.25f, N, V);
  for (size_t i = 0; i < buf.size(); ++i) EXPECT_EQ(buf[i], dlogits[i]) << "dlogits index " << i;
}

// ============================== embeddings, elementwise ==============================

TEST(Embedding, ForwardSumsRowsAndBackwardAccumulatesRepeatedTokens) {
  std::mt19937 rng(50);
  const int B = 2, T = 5, C = 12, V = 37;
  const std::vector<int32_t> tokens = {3, 0, 36, 3, 3, 7, 36, 0, 11, 3};  // repeats within and across rows
  const Vec wte = RandomVec(V * C, rng), wpe = RandomVec(T * C, rng), dout = RandomVec(B * T * C, rng);
  Vec out(B * T * C, kGarbage);
  EmbeddingForward(tokens.data(), wte.data(), wpe.data(), out.data(), B, T, C);
  const Vec dwte0 = RandomVec(V * C, rng), dwpe0 = RandomVec(T * C, rng);
  Vec dwte = dwte0, dwpe = dwpe0;
  EmbeddingBackward(dout.data(), tokens.data(), dwte.data(), dwpe.data(), B, T, C);

  DVec ref_out(B * T * C), ref_dwte(V * C, 0.0), ref_dwpe(T * C, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int tok = tokens[b * T + t];
      for (int c = 0; c < C; ++c) {
        ref_out[(b * T + t) * C + c] = static_cast<double>(wte[tok * C + c]) + wpe[t * C + c];
        ref_dwte[tok * C + c] += dout[(b * T + t) * C + c];
        ref_dwpe[t * C + c] += dout[(b * T + t) * C + c];
      }
    }
  }
  // One fp32 addition per output (a few for the repeated token 3): 1e-6 of scale is ~10 ulp.
  EXPECT_TRUE(AllClose("out", out, ref_out, 1e-6));
  EXPECT_TRUE(AllClose("dwte", dwte, Plus(dwte0, ref_dwte), 1e-6));
  EXPECT_TRUE(AllClose("dwpe", dwpe, Plus(dwpe0, ref_dwpe), 1e-6));
}

TEST(Elementwise, AddAndAddIntoAreExactIncludingInPlace) {
  std::mt19937 rng(60);
  const size_t n = 37;
  const Vec a = RandomVec(n, rng), b = RandomVec(n, rng);
  Vec out(n, kGarbage), dst = a, aliased = a;
  Add(a.data(), b.data(), out.data(), n);
  AddInto(dst.data(), b.data(), n);
  Add(aliased.data(), b.data(), aliased.data(), n);  // out == a, as a residual update does
  for (size_t i = 0; i < n; ++i) {
    const float expected = a[i] + b[i];  // one correctly rounded fp32 add: exact comparison
    EXPECT_EQ(out[i], expected) << "Add index " << i;
    EXPECT_EQ(dst[i], expected) << "AddInto index " << i;
    EXPECT_EQ(aliased[i], expected) << "in-place Add index " << i;
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
