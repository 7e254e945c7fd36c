// The param-copy conversions of the optimizer kernels (element_math.h's integer RNE casts on the device,
// so the bits equal the host's), scalar and 8-wide.
#pragma once

#include "kernels/common/element_math.h"
#include "kernels/common/optimizer_arrays.h"
#include "kernels/cuda/launch_util.cuh"

namespace strata::kernels::cuda {

template <ParamCopy kCopy>
__device__ __forceinline__ void StoreCopy1(uint16_t* out, float p) {
  if constexpr (kCopy == ParamCopy::kBf16) *out = FloatToBf16(p);
  if constexpr (kCopy == ParamCopy::kF16) *out = FloatToHalf(p);
}

template <ParamCopy kCopy>
__device__ __forceinline__ void StoreCopy8(uint16_t* out, const Float8& p) {
  if constexpr (kCopy != ParamCopy::kNone) {
    uint16_t h[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) h[j] = kCopy == ParamCopy::kBf16 ? FloatToBf16(p.v[j]) : FloatToHalf(p.v[j]);
    Store8(out, h);
  }
}

}  // namespace strata::kernels::cuda
