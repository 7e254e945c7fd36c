// SGD with momentum on the device (torch.optim.SGD, dampening 0, not Nesterov), with the optional param
// copy in the same pass; the shared element math, so bit for bit the host's. 16-byte accesses,
// grid-stride, caller's stream, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/element_math.h"
#include "kernels/common/optimizer_arrays.h"

namespace strata::kernels::cuda {

// Elements [begin, end) of `a` (device pointers; momentum in a.m, a.v unused): g = grad * grad_scale,
// then SgdUpdate with `step`. Returns the launch error.
cudaError_t LaunchSgd(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& step, float grad_scale,
                      cudaStream_t stream);

}  // namespace strata::kernels::cuda
