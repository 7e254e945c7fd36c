// fp32 -> bf16 / fp16 on the device with element_math.h's round-to-nearest-even casts (NaN quiet, Inf
// kept, overflow to Inf, subnormals exact), so the bits equal the host's. 16-byte accesses, grid-stride,
// caller's stream, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/optimizer_arrays.h"

namespace strata::kernels::cuda {

// y[i] = FloatToBf16(x[i]) (to == kBf16) or FloatToHalf(x[i]) (kF16) for i < n; kNone is a no-op.
cudaError_t LaunchCast(const float* x, uint16_t* y, size_t n, ParamCopy to, cudaStream_t stream);

// y[i] = Bf16ToFloat(x[i]) (from == kBf16) or HalfToFloat(x[i]) (kF16) for i < n: exact widening (the
// GPT's low-precision parameters read in fp32). Grid-stride, one element per step; kNone is a no-op.
cudaError_t LaunchWiden(const uint16_t* x, float* y, size_t n, ParamCopy from, cudaStream_t stream);

}  // namespace strata::kernels::cuda
