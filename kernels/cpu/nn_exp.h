// Internal to the nn kernels: an fp32 exp that GCC vectorises, for the softmax, cross-entropy and GELU
// loops (nn_attention.cc, nn_ops.cc).
//
// Note [Vectorisable exp]
// glibc's expf is a call, so a loop containing it stays scalar (~2-4 ns an element measured here, the
// largest non-GEMM cost of attention at T = 1024); its SIMD variants are only declared under
// -ffast-math, which we do not use. Exp is branch-free inline arithmetic instead: Cody-Waite reduction
// x = n ln2 + r with |r| <= ln2 / 2, Cephes' degree-6 polynomial for e^r, and 2^n added to the exponent
// bits. Error <= 1 ulp against exp in double over [-87.33, 88.72] (tests/kernels/nn_test.cc). Edges:
// x < -87.33 (results below ~1.2e-38, the smallest normals) gives 0 where libm gives a (sub)normal,
// x > 88.7228 (ln of FLT_MAX) gives +inf, NaN gives NaN. The selects are plain ternaries on values (not std::min, which
// returns a reference and blocks if-conversion); the library builds with -fno-trapping-math so GCC may
// if-convert float compares (it changes no value: we never read FP exception flags).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace strata::kernels::cpu::internal {

inline float Exp(float x) {
  constexpr float kMinArg = -87.33f;              // ~ln(2^-125.99): keeps 2^n p normal (p >= 1 at n = -126)
  constexpr float kMaxArg = 88.72283f;           // just below ln(2^128)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;         // ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 bits, so n * kLn2Hi
  constexpr float kLn2Lo = -2.12194440e-4f;      // is exact for |n| <= 128
  constexpr float kRound = 12582912.0f;          // 1.5 * 2^23: adding it rounds to an integer in the low bits
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
  const uint32_t exponent = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound)) << 23;
  float y = std::bit_cast<float>(std::bit_cast<uint32_t>(p) + exponent);
  y = x < kMinArg ? 0.0f : y;
  y = x > kMaxArg ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}

}  // namespace strata::kernels::cpu::internal
