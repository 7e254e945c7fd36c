// The device tier's ops of a CUDA device (Note [Tier ops]), which run the kernels/cuda twins and so live
// in libstrata_cuda.so: the module's memory part (cuda_backend.h) hands out CreateCudaTierOps, which the
// core reaches through MakeCudaTierOps (tier_ops.h).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/memory/tier_ops.h"

namespace strata::memory {

// Module side (tier_ops_cuda.cc): the device tier of `device` (a CUDA device); InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<TierOps>> CreateCudaTierOps(device::Device& device);

}  // namespace strata::memory
