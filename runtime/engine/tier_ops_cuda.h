// The engine part of the CUDA back-end module (runtime/base/module.h): the device tier's ops (Note [Tier
// ops]), which run the kernels/cuda twins and so live in libstrata_cuda.so. The core reaches them through
// MakeCudaTierOps (tier_ops.h); the module fills CudaTierOpsApi with CreateCudaTierOps.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/engine/tier_ops.h"

namespace strata::engine {

struct CudaTierOpsApi {
  static constexpr char kPart[] = "tier_ops";
  static constexpr uint32_t kVersion = 1;
  absl::StatusOr<std::unique_ptr<TierOps>> (*create)(device::Device& device);  // CreateCudaTierOps
};

// Module side (tier_ops_cuda.cc): the device tier of `device` (a CUDA device); InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<TierOps>> CreateCudaTierOps(device::Device& device);

}  // namespace strata::engine
