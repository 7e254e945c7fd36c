// The pooled tensor kernels: casts, scale and accumulate (and the 16-bit forms) equal the scalar element
// math for every variant and thread count; SumSquares gives the same bits for every variant and thread count and stays
// within its stated bound of an exact (long double) sum; CountNonFinite counts exactly.
#include "kernels/cpu/tensor_ops.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace strata::kernels::cpu {
namespace {

using testing::AllIsas;
using testing::ExpectBitEqual;
using testing::IsaParamName;
using testing::RandomBits;
using testing::TestSizes;
using testing::Uniform;

class TensorOpsTest : public ::testing::TestWithParam<Isa> {};

TEST_P(TensorOpsTest, CastsAndScaleEqualTheElementMath) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  ThreadPool pool(ThreadPool::Options{2, {}});
  for (size_t n : TestSizes()) {
    const std::vector<float> x = RandomBits(n, 21);
    std::vector<uint16_t> bf(n), hf(n), want_bf(n), want_hf(n);
    std::vector<float> scaled(n), want_scaled(n);
    for (size_t i = 0; i < n; ++i) {
      want_bf[i] = FloatToBf16(x[i]);
      want_hf[i] = FloatToHalf(x[i]);
      want_scaled[i] = x[i] * 1.5f;
    }
    CastToBf16(*k, &pool, x.data(), bf.data(), n);
    CastToHalf(*k, &pool, x.data(), hf.data(), n);
    Scale(*k, &pool, x.data(), scaled.data(), n, 1.5f);
    ExpectBitEqual(want_bf, bf, "bf16 n=" + std::to_string(n));
    ExpectBitEqual(want_hf, hf, "fp16 n=" + std::to_string(n));
    ExpectBitEqual(want_scaled, scaled, "scale n=" + std::to_string(n));
  }
}

TEST_P(TensorOpsTest, AccumulateEqualsTheElementMathForEveryThreadCount) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(ThreadPool::Options{threads, {}});
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, kElementwiseTileElems + 3, 3 * kElementwiseTileElems}) {
      std::vector<float> x = RandomBits(n, 41);
      const std::vector<float> y0 = RandomBits(n, 42);
      for (size_t i = 0; i < n; ++i) {  // NaN + NaN has no defined payload: one side NaN at most
        if (std::isnan(x[i]) && std::isnan(y0[i])) x[i] = 1.0f;
      }
      std::vector<float> want(n), got = y0;
      for (size_t i = 0; i < n; ++i) want[i] = y0[i] + x[i];
      Accumulate(*k, &pool, x.data(), got.data(), n);
      ExpectBitEqual(want, got, "threads=" + std::to_string(threads) + " n=" + std::to_string(n));
    }
  }
}

// The 16-bit forms round through fp32 once per element, as the element math does.
TEST(TensorOps, SixteenBitAccumulateAndScaleRoundThroughFp32) {
  for (size_t n : TestSizes()) {
    const std::vector<float> a = Uniform(n, -4.0f, 4.0f, 51), b = Uniform(n, -4.0f, 4.0f, 52);
    std::vector<uint16_t> xb(n), yb(n), xh(n), yh(n), want_ab(n), want_ah(n), want_sb(n), want_sh(n);
    for (size_t i = 0; i < n; ++i) {
      xb[i] = FloatToBf16(a[i]);
      yb[i] = FloatToBf16(b[i]);
      xh[i] = FloatToHalf(a[i]);
      yh[i] = FloatToHalf(b[i]);
      want_ab[i] = FloatToBf16(Bf16ToFloat(yb[i]) + Bf16ToFloat(xb[i]));
      want_ah[i] = FloatToHalf(HalfToFloat(yh[i]) + HalfToFloat(xh[i]));
      want_sb[i] = FloatToBf16(Bf16ToFloat(want_ab[i]) * 0.75f);
      want_sh[i] = FloatToHalf(HalfToFloat(want_ah[i]) * 0.75f);
    }
    AccumulateBf16(xb.data(), yb.data(), n);
    AccumulateHalf(xh.data(), yh.data(), n);
    ExpectBitEqual(want_ab, yb, "bf16 add n=" + std::to_string(n));
    ExpectBitEqual(want_ah, yh, "fp16 add n=" + std::to_string(n));
    ScaleBf16(yb.data(), n, 0.75f);
    ScaleHalf(yh.data(), n, 0.75f);
    ExpectBitEqual(want_sb, yb, "bf16 scale n=" + std::to_string(n));
    ExpectBitEqual(want_sh, yh, "fp16 scale n=" + std::to_string(n));
  }
}

TEST(TensorOps, SumSquaresInOrderIsTheSequentialDoubleSum) {
  // Values whose squares differ by 2^60: a sum in another order (lanes, tiles) rounds differently.
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 7 == 0) ? 1.0e9f : 1.0e-9f * static_cast<float>(i + 1);
  double want = 0;
  for (float f : x) want += static_cast<double>(f) * f;
  EXPECT_EQ(SumSquaresInOrder(x.data(), x.size()), want);
  EXPECT_EQ(SumSquaresInOrder(x.data(), 0), 0.0);
}

// Bound: every partial sum is a double rounding of non-negative terms, so the relative error of the
// fixed-order sum is at most (number of additions on the longest path) * 2^-53 of the exact sum, to
// first order: n / 32 lane additions + 5 folds + 16 tiles + n / 2^18 chunks < n * 2^-53 for these n.
TEST_P(TensorOpsTest, SumSquaresIsIndependentOfVariantAndThreadsAndWithinItsBound) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  for (size_t n : TestSizes()) {
    const std::vector<float> x = Uniform(n, -10.0f, 10.0f, 31);
    const double ref = SumSquares(ScalarKernels(), nullptr, x.data(), n);
    long double exact = 0;
    for (float f : x) exact += static_cast<long double>(f) * f;
    const double bound = static_cast<double>(exact) * (static_cast<double>(n) + 64) * 0x1p-53;
    EXPECT_NEAR(ref, static_cast<double>(exact), bound) << "n=" << n;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(ThreadPool::Options{threads, {}});
      EXPECT_EQ(SumSquares(*k, &pool, x.data(), n), ref) << "n=" << n << " threads=" << threads;
    }
  }
}

TEST_P(TensorOpsTest, SumSquaresOfNonFiniteInputsIsNonFinite) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  std::vector<float> x(100000, 1.0f);
  x[77777] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(SumSquares(*k, nullptr, x.data(), x.size())));
  x[77777] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(SumSquares(*k, nullptr, x.data(), x.size()), std::numeric_limits<double>::infinity());
}

TEST_P(TensorOpsTest, CountNonFiniteCountsEveryInfAndNan) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  ThreadPool pool(ThreadPool::Options{2, {}});
  for (size_t n : TestSizes()) {
    const std::vector<float> x = RandomBits(n, 41);
    size_t want = 0;
    for (float f : x) want += IsFinite(f) ? 0 : 1;
    EXPECT_EQ(CountNonFinite(*k, &pool, x.data(), n), want) << "n=" << n;
    EXPECT_EQ(CountNonFinite(*k, nullptr, x.data(), n), want) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, TensorOpsTest, ::testing::ValuesIn(AllIsas()), IsaParamName);

}  // namespace
}  // namespace strata::kernels::cpu
