// Fused AdamW on the device: one pass reads grad, master, m, v and writes master, m, v and the optional
// bf16 / fp16 param copy, with the shared element math (element_math.h, Note [One operation order]) so
// results are bit for bit those of the host kernels (this library builds with --fmad=false; sqrt and
// division are IEEE-rounded, denormals kept). 16-byte loads and stores where the arrays share an
// alignment phase, grid-stride, on the caller's stream; nothing allocates, nothing synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/element_math.h"
#include "kernels/common/optimizer_arrays.h"

namespace strata::kernels::cuda {

// Elements [begin, end) of `a` (device pointers): g = grad * grad_scale, then AdamWUpdate with `c`
// (AdamWCoeffsOf(step), where the step carries the segment's weight decay). Returns the launch error.
cudaError_t LaunchAdamW(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c,
                        float grad_scale, cudaStream_t stream);

}  // namespace strata::kernels::cuda
