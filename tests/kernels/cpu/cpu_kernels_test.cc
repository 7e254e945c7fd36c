// Every host kernel variant against the scalar reference table, bit for bit (the variants run the same
// operations in the same order: Note [One operation order], Note [Sum of squares order]), over the sizes
// 0, 1, 7, 4099 and ~3 million, at aligned and unaligned starts. Each variant this CPU supports runs;
// the others are skipped with the reason, so CI exercises every variant its machine has.
#include "kernels/cpu/cpu_kernels.h"

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

class CpuKernelsTest : public ::testing::TestWithParam<Isa> {};

struct State {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> copy;
};

State MakeState(size_t n, uint32_t seed) {
  State s{Uniform(n, -1.0f, 1.0f, seed), Uniform(n, -2.0f, 2.0f, seed + 1), Uniform(n, -0.1f, 0.1f, seed + 2),
          Uniform(n, 0.0f, 0.01f, seed + 3), std::vector<uint16_t>(n, 0xdead)};
  for (size_t i = 0; i < n; i += 97) s.grad[i] = 0.0f;               // zero gradients
  for (size_t i = 5; i < n; i += 101) s.master[i] = 1e-40f;         // subnormal masters
  for (size_t i = 11; i < n; i += 103) s.v[i] = 0.0f;               // fresh second moments
  return s;
}

OptimizerArrays Arrays(State& s, ParamCopy copy) {
  return OptimizerArrays{s.master.data(), s.grad.data(), s.m.data(), s.v.data(), s.copy.data(), copy};
}

void ExpectStatesEqual(const State& want, const State& got, const std::string& what) {
  ExpectBitEqual(want.master, got.master, what + " master");
  ExpectBitEqual(want.m, got.m, what + " m");
  ExpectBitEqual(want.v, got.v, what + " v");
  ExpectBitEqual(want.copy, got.copy, what + " param copy");
}

const char* CopyName(ParamCopy c) { return c == ParamCopy::kNone ? "none" : c == ParamCopy::kBf16 ? "bf16" : "fp16"; }

TEST_P(CpuKernelsTest, AdamWMatchesScalarBitForBit) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  const CpuKernels& ref = ScalarKernels();
  for (size_t n : TestSizes()) {
    for (ParamCopy copy : {ParamCopy::kNone, ParamCopy::kBf16, ParamCopy::kF16}) {
      for (size_t begin : {size_t{0}, size_t{3}}) {
        if (begin > n) continue;
        State want = MakeState(n, 7), got = want;
        for (long t = 1; t <= 3; ++t) {  // bias corrections change per step
          const AdamWCoeffs<float> c = AdamWCoeffsOf(MakeAdamWStep(1e-3 * t, 0.9, 0.999, 1e-8, 0.01 * t, t));
          ref.adamw(Arrays(want, copy), begin, n, c, 0.75f);
          k->adamw(Arrays(got, copy), begin, n, c, 0.75f);
        }
        ExpectStatesEqual(want, got, "n=" + std::to_string(n) + " begin=" + std::to_string(begin) + " copy=" +
                                         CopyName(copy));
      }
    }
  }
}

TEST_P(CpuKernelsTest, SgdMatchesScalarBitForBit) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  const CpuKernels& ref = ScalarKernels();
  const SgdStep step{0.05f, 0.9f, 1e-4f};
  for (size_t n : TestSizes()) {
    for (ParamCopy copy : {ParamCopy::kNone, ParamCopy::kBf16, ParamCopy::kF16}) {
      State want = MakeState(n, 11), got = want;
      for (int t = 0; t < 2; ++t) {
        ref.sgd(Arrays(want, copy), 1 < n ? 1 : n, n, step, 0.5f);
        k->sgd(Arrays(got, copy), 1 < n ? 1 : n, n, step, 0.5f);
      }
      ExpectStatesEqual(want, got, "n=" + std::to_string(n) + " copy=" + CopyName(copy));
    }
  }
}

// The inputs where rounding is decided: every 16-bit pattern's value as bf16 and as fp16, the midpoints
// to the next value (ties), one float ulp either side of them, and random bit patterns (every float class,
// NaN payloads, float subnormals, values beyond the fp16 range).
std::vector<float> RoundingInputs() {
  std::vector<float> x = RandomBits(100003, 5);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float b = Bf16ToFloat(static_cast<uint16_t>(h)), f = HalfToFloat(static_cast<uint16_t>(h));
    const float b_next = Bf16ToFloat(static_cast<uint16_t>(h + 1)), f_next = HalfToFloat(static_cast<uint16_t>(h + 1));
    for (float base : {b, f}) x.push_back(base);
    for (auto [lo, hi] : {std::pair{b, b_next}, std::pair{f, f_next}}) {
      if (!std::isfinite(lo) || !std::isfinite(hi) || std::signbit(lo) != std::signbit(hi)) continue;
      const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
      x.insert(x.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity())});
    }
  }
  return x;
}

TEST_P(CpuKernelsTest, CastsMatchScalarBitForBitOnEveryRoundingCase) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  const std::vector<float> x = RoundingInputs();
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, x.size()}) {
    for (size_t off : {size_t{0}, size_t{1}}) {
      if (off > n) continue;
      const size_t len = n - off;
      // The output is shifted by `off` too, so the streamed body starts after a masked head.
      std::vector<uint16_t> want(len + off, 1), got(len + off, 2);
      ScalarKernels().cast_bf16(x.data() + off, want.data() + off, len);
      k->cast_bf16(x.data() + off, got.data() + off, len);
      if (off > 0) want[0] = got[0];  // the unwritten prefix
      ExpectBitEqual(want, got, "bf16 n=" + std::to_string(len) + " off=" + std::to_string(off));
      ScalarKernels().cast_f16(x.data() + off, want.data() + off, len);
      k->cast_f16(x.data() + off, got.data() + off, len);
      ExpectBitEqual(want, got, "fp16 n=" + std::to_string(len) + " off=" + std::to_string(off));
    }
  }
}

TEST_P(CpuKernelsTest, ScaleMatchesScalarInPlaceAndOutOfPlace) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  for (size_t n : TestSizes()) {
    const std::vector<float> x = RandomBits(n, 3);
    std::vector<float> want(n), got(n), in_place = x;
    ScalarKernels().scale(x.data(), want.data(), n, 0.3f);
    k->scale(x.data(), got.data(), n, 0.3f);
    k->scale(in_place.data(), in_place.data(), n, 0.3f);
    ExpectBitEqual(want, got, "n=" + std::to_string(n));
    ExpectBitEqual(want, in_place, "in place n=" + std::to_string(n));
  }
}

TEST_P(CpuKernelsTest, AccumulateAddsEachElementOnceWithTheScalarBits) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  for (size_t n : TestSizes()) {
    std::vector<float> x = RandomBits(n, 5);
    const std::vector<float> y0 = RandomBits(n, 6);
    // NaN + NaN has no defined payload (x86 keeps either operand's, and the compiler may commute an add):
    // only one side may be NaN. NaN and Inf inputs are otherwise included (RandomBits).
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(x[i]) && std::isnan(y0[i])) x[i] = 1.0f;
    }
    std::vector<float> want(n), got = y0, scalar = y0;
    for (size_t i = 0; i < n; ++i) want[i] = y0[i] + x[i];
    ScalarKernels().accumulate(x.data(), scalar.data(), n);
    k->accumulate(x.data(), got.data(), n);
    ExpectBitEqual(want, scalar, "scalar n=" + std::to_string(n));
    ExpectBitEqual(want, got, "n=" + std::to_string(n));
  }
}

TEST_P(CpuKernelsTest, SumSquaresMatchesScalarBitForBit) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  std::vector<size_t> sizes = TestSizes();
  for (size_t n = 25; n <= 70; ++n) sizes.push_back(n);  // every tail length around one and two lane rows
  for (size_t n : sizes) {
    const std::vector<float> x = Uniform(n, -3.0f, 3.0f, static_cast<uint32_t>(n));
    const double want = ScalarKernels().sum_squares(x.data(), n), got = k->sum_squares(x.data(), n);
    EXPECT_EQ(testing::Bits(static_cast<float>(want)), testing::Bits(static_cast<float>(got))) << "n=" << n;
    EXPECT_EQ(want, got) << "n=" << n;
  }
}

TEST_P(CpuKernelsTest, CountNonFiniteMatchesScalar) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  for (size_t n : TestSizes()) {
    const std::vector<float> x = RandomBits(n, 9);  // about 1 in 256 patterns is Inf or NaN
    EXPECT_EQ(ScalarKernels().count_non_finite(x.data(), n), k->count_non_finite(x.data(), n)) << "n=" << n;
  }
  std::vector<float> x(37, 1.0f);
  x[36] = std::numeric_limits<float>::infinity();
  x[20] = -std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(k->count_non_finite(x.data(), x.size()), 2u);
  EXPECT_EQ(k->count_non_finite(x.data(), 20), 0u);
}

TEST_P(CpuKernelsTest, AdamWPropagatesNonFiniteGradientsLikeScalar) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  State want = MakeState(100, 13);
  want.grad[3] = std::numeric_limits<float>::infinity();
  want.grad[40] = std::numeric_limits<float>::quiet_NaN();
  want.grad[77] = 3e38f;  // g*g overflows to Inf in v
  State got = want;
  const AdamWCoeffs<float> c = AdamWCoeffsOf(MakeAdamWStep(1e-3, 0.9, 0.999, 1e-8, 0.1, 1));
  ScalarKernels().adamw(Arrays(want, ParamCopy::kBf16), 0, 100, c, 1.0f);
  k->adamw(Arrays(got, ParamCopy::kBf16), 0, 100, c, 1.0f);
  ExpectStatesEqual(want, got, "non-finite gradients");
  EXPECT_TRUE(std::isnan(got.master[3]) && std::isnan(got.master[40]));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CpuKernelsTest, ::testing::ValuesIn(AllIsas()), IsaParamName);

TEST(Isa, NamesRoundTripAndScalarIsAlwaysThere) {
  for (Isa isa : AllIsas()) {
    Isa parsed = Isa::kScalar;
    EXPECT_TRUE(ParseIsa(IsaName(isa), &parsed));
    EXPECT_EQ(parsed, isa);
  }
  Isa untouched = Isa::kAvx2;
  EXPECT_FALSE(ParseIsa("avx9000", &untouched));
  EXPECT_FALSE(ParseIsa("", &untouched));
  EXPECT_EQ(untouched, Isa::kAvx2);
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  EXPECT_NE(GetCpuKernels(BestIsa()), nullptr);
  EXPECT_EQ(GetCpuKernels(BestIsa())->isa, BestIsa());
}

}  // namespace
}  // namespace strata::kernels::cpu
