// The scalar reference variant: plain loops over the shared element math (element_math.h). Compiled with
// the baseline flags only, so it runs everywhere; every vector variant is tested against it bit for bit.
#include <cstddef>
#include <cstdint>

#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_kernels.h"

namespace strata::kernels::cpu {
namespace {

template <ParamCopy kCopy>
void StoreCopy(uint16_t* out, float p) {
  if constexpr (kCopy == ParamCopy::kBf16) *out = FloatToBf16(p);
  if constexpr (kCopy == ParamCopy::kF16) *out = FloatToHalf(p);
}

template <ParamCopy kCopy>
void AdamWRange(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c, float gs) {
  for (size_t i = begin; i < end; ++i) {
    float p = a.master[i], m = a.m[i], v = a.v[i];
    AdamWUpdate(a.grad[i] * gs, p, m, v, c);
    a.master[i] = p;
    a.m[i] = m;
    a.v[i] = v;
    StoreCopy<kCopy>(a.param_copy + i, p);
  }
}

template <ParamCopy kCopy>
void SgdRange(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float gs) {
  for (size_t i = begin; i < end; ++i) {
    float p = a.master[i], buf = a.m[i];
    SgdUpdate(a.grad[i] * gs, p, buf, c.lr, c.momentum, c.weight_decay);
    a.master[i] = p;
    a.m[i] = buf;
    StoreCopy<kCopy>(a.param_copy + i, p);
  }
}

void AdamW(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c, float gs) {
  WithParamCopy(a.copy, [&]<ParamCopy kCopy>() { AdamWRange<kCopy>(a, begin, end, c, gs); });
}

void Sgd(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float gs) {
  WithParamCopy(a.copy, [&]<ParamCopy kCopy>() { SgdRange<kCopy>(a, begin, end, c, gs); });
}

void CastBf16(const float* x, uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToBf16(x[i]);
}

void CastF16(const float* x, uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToHalf(x[i]);
}

void Scale(const float* x, float* y, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

void Accumulate(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

// Note [Sum of squares order], literally.
double SumSquares(const float* x, size_t n) {
  double lane[kSumLanes] = {};
  for (size_t i = 0; i < n; ++i) {
    const double d = x[i];
    lane[i % kSumLanes] += d * d;
  }
  for (int w = kSumLanes / 2; w >= 1; w /= 2) {
    for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
  }
  return lane[0];
}

size_t CountNonFinite(const float* x, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += IsFinite(x[i]) ? 0 : 1;
  return count;
}

constexpr CpuKernels kTable = {Isa::kScalar, AdamW,      Sgd,        CastBf16,      CastF16,
                               Scale,        Accumulate, SumSquares, CountNonFinite};

}  // namespace

const CpuKernels& ScalarKernels() { return kTable; }

}  // namespace strata::kernels::cpu
