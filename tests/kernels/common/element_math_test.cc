// The shared element math against independent oracles: bf16 / fp16 rounding (nearest, ties to even)
// decided in double arithmetic over every tie, subnormal, NaN, Inf and overflow boundary; the update
// templates against the literal torch-order formulas they replaced (bit for bit).
#include "kernels/common/element_math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace strata::kernels {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Rounds finite f to the format whose finite non-negative values are decode(0..max_finite), by
// distance in double (exact for these formats) and ties to the even code; Inf when f is at least
// halfway between the largest finite value and the next power of the exponent step (IEEE overflow).
template <class Decode>
uint16_t RoundOracle(float f, Decode decode, uint16_t max_finite, uint16_t inf_code, double overflow_at) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= overflow_at) return sign | inf_code;
  uint16_t lo = 0, hi = max_finite;  // largest code with decode(code) <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (static_cast<double>(decode(mid)) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == max_finite) return sign | lo;
  const double below = a - decode(lo), above = static_cast<double>(decode(static_cast<uint16_t>(lo + 1))) - a;
  const bool up = above < below || (above == below && (lo & 1));
  return sign | static_cast<uint16_t>(up ? lo + 1 : lo);
}

uint16_t Bf16Oracle(float f) {  // max finite bf16 = 0x7f7f; overflow at (2 - 2^-8) * 2^127
  return RoundOracle(f, Bf16ToFloat, 0x7f7f, 0x7f80, std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
}
uint16_t HalfOracle(float f) {  // max finite fp16 = 65504; overflow at 65520
  return RoundOracle(f, HalfToFloat, 0x7bff, 0x7c00, 65520.0);
}

// Every code's value, the midpoints to its neighbour (the ties), and one float ulp either side.
template <class Decode>
std::vector<float> BoundaryInputs(Decode decode, uint16_t max_finite) {
  std::vector<float> x;
  for (uint32_t h = 0; h <= max_finite; ++h) {
    const float v = decode(static_cast<uint16_t>(h));
    const float next = h < max_finite ? decode(static_cast<uint16_t>(h + 1)) : v * 2;
    const float mid = static_cast<float>((static_cast<double>(v) + next) / 2);
    for (float s : {1.0f, -1.0f}) {
      for (float y : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) x.push_back(s * y);
    }
  }
  return x;
}

TEST(FloatToBf16, RoundsToNearestEvenAtEveryBoundary) {
  for (float f : BoundaryInputs(Bf16ToFloat, 0x7f7f)) {
    ASSERT_EQ(FloatToBf16(f), Bf16Oracle(f)) << "f=" << f << " bits 0x" << std::hex << ToBits(f);
  }
}

TEST(FloatToBf16, HandlesSubnormalsNanInfAndOverflow) {
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001)), 0x0000) << "smallest float subnormal rounds to +0";
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000)), 0x0000) << "tie to even (0)";
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002) << "tie to even (2)";
  EXPECT_EQ(FloatToBf16(FromBits(0x00008001)), 0x0001) << "bf16 subnormal produced";
  EXPECT_EQ(FloatToBf16(FromBits(0x807fffff)), 0x8080) << "largest negative subnormal rounds up to -min normal";
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80) << "overflow rounds to Inf";
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fff)), 0x7f7f) << "just below the overflow tie";
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f8000)), 0x7f80) << "the overflow tie goes to even = Inf";
  EXPECT_EQ(FloatToBf16(FromBits(0x7f800001)), 0x7fc0) << "signalling NaN is quieted, not turned into Inf";
  EXPECT_EQ(FloatToBf16(FromBits(0xffc12345)), 0xffc1) << "quiet NaN keeps sign and top payload";
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every bf16 value round-trips
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16(f), h) << std::hex << h;
    }
  }
}

TEST(FloatToHalf, RoundsToNearestEvenAtEveryBoundary) {
  for (float f : BoundaryInputs(HalfToFloat, 0x7bff)) {
    ASSERT_EQ(FloatToHalf(f), HalfOracle(f)) << "f=" << f << " bits 0x" << std::hex << ToBits(f);
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), std::isinf(f) ? (f > 0 ? 0x7c00 : 0xfc00) : HalfOracle(f)) << f;
  }
}

TEST(FloatToHalf, HandlesSubnormalsNanInfAndOverflow) {
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001) << "smallest fp16 subnormal";
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000) << "tie between 0 and the smallest subnormal: even";
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -24)), 0x0002) << "tie between 1 and 2 ulps: even";
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400) << "rounds up into the normals";
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff) << "below the overflow tie";
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00) << "overflow tie goes to even = Inf";
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(FromBits(0x7f800001)), 0x7e00) << "signalling NaN is quieted, not turned into Inf";
  EXPECT_EQ(FloatToHalf(FromBits(0xffc12345)), 0xfe00) << "NaN keeps its sign, payload dropped";
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every fp16 value round-trips
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

// The AdamW element exactly as element_math.h computed it before the update templates existed.
void LiteralAdamW(float g, float& p, float& m, float& v, const AdamWStep& s) {
  p = p * (1.0f - s.lr * s.weight_decay);
  m = m + (1.0f - s.beta1) * (g - m);
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = p - s.step_size * (m / denom);
}

TEST(AdamWElement, IsTheLiteralTorchOrderFormulaBitForBit) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 200000; ++i) {
    const AdamWStep s = MakeAdamWStep(1e-3, 0.9, 0.95 + 0.04 * (i % 2), 1e-8, 0.1 * (i % 3), 1 + i % 50);
    float p = u(rng), m = 0.1f * u(rng), v = 0.01f * std::fabs(u(rng));
    float p2 = p, m2 = m, v2 = v;
    const float g = u(rng);
    AdamWElement(g, p, m, v, s);
    LiteralAdamW(g, p2, m2, v2, s);
    ASSERT_EQ(ToBits(p), ToBits(p2)) << i;
    ASSERT_EQ(ToBits(m), ToBits(m2)) << i;
    ASSERT_EQ(ToBits(v), ToBits(v2)) << i;
  }
}

TEST(SgdElement, IsTheTorchRecurrence) {
  float p = 2.0f, buf = 0.0f;
  SgdElement(0.5f, p, buf, SgdStep{0.1f, 0.9f, 0.01f});
  const float g = 0.5f + 0.01f * 2.0f;
  EXPECT_EQ(buf, g);
  EXPECT_EQ(p, 2.0f - 0.1f * g);
}

TEST(IsFinite, ClassifiesEveryClass) {
  EXPECT_TRUE(IsFinite(0.0f));
  EXPECT_TRUE(IsFinite(FromBits(1)));
  EXPECT_TRUE(IsFinite(std::numeric_limits<float>::max()));
  EXPECT_FALSE(IsFinite(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(IsFinite(-std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(IsFinite(FromBits(0x7f800001)));
}

}  // namespace
}  // namespace strata::kernels
