// Element math shared by the host kernels, the runtime's reference loops and the CUDA kernels.
//
// Every function here is __host__ __device__ when compiled by nvcc, plain inline otherwise, so one
// definition of AdamW, SGD and the low-precision casts serves every back-end and the host tests cover
// the device arithmetic. No Abseil, no runtime/ (kernels are a leaf library).
//
// Casts round to nearest, ties to even; NaN stays NaN (quiet), Inf stays Inf, values beyond the
// target's range become Inf, subnormals are produced and consumed exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata::kernels {

STRATA_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
STRATA_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

STRATA_HD uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}
STRATA_HD float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// Rounds `m >> shift` to nearest even (shift >= 1).
STRATA_HD uint32_t ShiftRoundEven(uint32_t m, uint32_t shift) {
  if (shift >= 32) return 0;
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

STRATA_HD uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x0200u : 0u);  // Inf / NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;                                       // >= 65520: Inf
  const uint32_t e = x >> 23;
  if (e < 113) {  // below 2^-14: a half subnormal (or zero)
    const uint32_t m = (x & 0x7fffffu) | (e ? 0x800000u : 0u);
    return sign | static_cast<uint16_t>(ShiftRoundEven(m, 126u - (e ? e : 1u)));
  }
  const uint32_t q = ((e - 112u) << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rem = x & 0x1fffu;
  const uint32_t r = (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ? q + 1u : q;
  return sign | static_cast<uint16_t>(r);
}

STRATA_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return BitsFloat(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    // Subnormal: m * 2^-24, exact in float.
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

STRATA_HD bool IsFinite(float f) { return (FloatBits(f) & 0x7f800000u) != 0x7f800000u; }

// Hyper-parameters of one AdamW step, with the bias corrections precomputed by the caller (in double)
// so every element does the same float arithmetic on every back-end.
struct AdamWStep {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

inline AdamWStep MakeAdamWStep(double lr, double beta1, double beta2, double eps, double weight_decay, long step) {
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  return s;
}

// One element of decoupled-weight-decay Adam, in the order torch.optim.AdamW computes it:
//   p *= 1 - lr*wd;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;  p -= step_size * m / (sqrt(v)/bc2 + eps)
STRATA_HD void AdamWElement(float g, float& p, float& m, float& v, const AdamWStep& s) {
  p = p * (1.0f - s.lr * s.weight_decay);
  m = m + (1.0f - s.beta1) * (g - m);
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = p - s.step_size * (m / denom);
}

struct SgdStep {
  float lr;
  float momentum;
  float weight_decay;
};

// SGD with momentum as torch.optim.SGD (dampening 0, not Nesterov): g += wd p; buf = mu buf + g; p -= lr buf.
STRATA_HD void SgdElement(float g, float& p, float& buf, const SgdStep& s) {
  g = g + s.weight_decay * p;
  buf = s.momentum * buf + g;
  p = p - s.lr * buf;
}

}  // namespace strata::kernels
