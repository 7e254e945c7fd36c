// Element math shared by the host kernels, the runtime's reference loops and the CUDA kernels.
// See Note [One operation order] for how the vector kernels reuse the same update templates.
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
  bool decoupled = true;        // AdamW; false: Adam with L2 (the decay added to the gradient)
};

// decoupled: DeepSpeed's adam_w_mode. false is torch.optim.Adam's weight_decay: g += wd * p first.
inline AdamWStep MakeAdamWStep(double lr, double beta1, double beta2, double eps, double weight_decay, long step,
                               bool decoupled = true) {
  AdamWStep s;
  s.decoupled = decoupled;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  return s;
}

// Note [One operation order]
// The element updates below are templates over the arithmetic type F: float here, in the runtime loop
// and in CUDA, and a SIMD register wrapper in the host vector kernels (kernels/cpu/*_impl.h). F needs
// + - * / (IEEE, correctly rounded) and a Sqrt(F) found by argument-dependent lookup. Every back-end thus
// runs the same operations in the same order on the same float coefficients, so results are bit-identical
// as long as nothing contracts a*b+c into an FMA (kernels build with -ffp-contract=off, CUDA with
// --fmad=false) and denormals are not flushed (MXCSR FTZ/DAZ off, the process default).
STRATA_HD float Sqrt(float x) { return sqrtf(x); }

// The per-step float coefficients of AdamWStep, computed once (each is the exact float expression the
// scalar element used to evaluate per element, so precomputing them changes no bit).
template <class F>
struct AdamWCoeffs {
  F decay;                  // 1 - lr*wd
  F one_minus_beta1;        // 1 - beta1
  F beta2;
  F one_minus_beta2;        // 1 - beta2
  F bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  F eps;
  F step_size;              // lr / (1 - beta1^t)
  F l2;                     // wd with L2 (Adam, adam_w_mode false), else 0
};

STRATA_HD AdamWCoeffs<float> AdamWCoeffsOf(const AdamWStep& s) {
  return AdamWCoeffs<float>{s.decoupled ? 1.0f - s.lr * s.weight_decay : 1.0f,
                            1.0f - s.beta1,
                            s.beta2,
                            1.0f - s.beta2,
                            s.bias_correction2_sqrt,
                            s.eps,
                            s.step_size,
                            s.decoupled ? 0.0f : s.weight_decay};
}

// One element of Adam, in the order torch.optim.AdamW (decoupled decay) or torch.optim.Adam (L2) computes it:
//   g += l2 p;  p *= 1 - lr*wd;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;  p -= step_size * m / (sqrt(v)/bc2 + eps)
// with l2 = 0 for AdamW and decay = 1 for Adam. g + 0 p is g for a finite p, so AdamW's bits are unchanged.
template <class F>
STRATA_HD void AdamWUpdate(F g, F& p, F& m, F& v, const AdamWCoeffs<F>& c) {
  g = g + c.l2 * p;
  p = p * c.decay;
  m = m + c.one_minus_beta1 * (g - m);
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  const F denom = Sqrt(v) / c.bias_correction2_sqrt + c.eps;
  p = p - c.step_size * (m / denom);
}

STRATA_HD void AdamWElement(float g, float& p, float& m, float& v, const AdamWStep& s) {
  AdamWUpdate(g, p, m, v, AdamWCoeffsOf(s));
}

struct SgdStep {
  float lr;
  float momentum;
  float weight_decay;
};

// SGD with momentum as torch.optim.SGD (dampening 0, not Nesterov): g += wd p; buf = mu buf + g; p -= lr buf.
// F as in Note [One operation order].
template <class F>
STRATA_HD void SgdUpdate(F g, F& p, F& buf, F lr, F momentum, F weight_decay) {
  g = g + weight_decay * p;
  buf = momentum * buf + g;
  p = p - lr * buf;
}

STRATA_HD void SgdElement(float g, float& p, float& buf, const SgdStep& s) {
  SgdUpdate(g, p, buf, s.lr, s.momentum, s.weight_decay);
}

}  // namespace strata::kernels
