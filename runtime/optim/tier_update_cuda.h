// The optim part of the CUDA back-end module (runtime/base/module.h): the optimizer's update over the
// device tier (tier_update.h), which runs the kernels/cuda twins and so lives in libstrata_cuda.so. The
// core reaches it through MakeCudaTierUpdate; the module fills CudaTierUpdateApi with CreateCudaTierUpdate.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/optim/tier_update.h"

namespace strata::optim {

struct CudaTierUpdateApi {
  static constexpr char kPart[] = "tier_update";
  static constexpr uint32_t kVersion = 1;
  absl::StatusOr<std::unique_ptr<TierUpdate>> (*create)(device::Device& device);  // CreateCudaTierUpdate
};

// Module side (tier_update_cuda.cc): the device tier of `device` (a CUDA device); InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<TierUpdate>> CreateCudaTierUpdate(device::Device& device);

}  // namespace strata::optim
