// TierUpdate: the optimizer's update (ApplyUpdate: AdamW or SGD with the fused param copy) over state that
// lives on one memory tier. The buffer operations of a tier are the memory layer's (Note [Tier ops] in
// runtime/memory/tier_ops.h); the update is the optimizer's arithmetic, so it lives here, one
// implementation per tier as there: MakeHostTierUpdate runs optim::ApplyUpdate (kernels/cpu) on a host
// executor, MakeCudaTierUpdate the kernels/cuda twins (tier_update_cuda.cc, in the CUDA back-end module),
// which share the element math, so both give the same bits. Blocking; all pointers on the tier.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/base/dtype.h"
#include "runtime/device/device.h"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/hyper.h"
#include "runtime/optim/optimizer.h"
#include "runtime/shard/layout.h"

namespace strata::optim {

class TierUpdate {
 public:
  virtual ~TierUpdate() = default;
  // optim::ApplyUpdate over `segs`; `param_copy` (may be null) receives the updated master in
  // `copy_dtype` (kBF16 / kF16) in the same pass.
  virtual absl::Status Update(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                              absl::Span<const GroupHyper> groups, int64_t step, float grad_scale, uint16_t* param_copy,
                              DType copy_dtype) = 0;
};

// Host memory. `executor` is the slot holding the executor the update runs on (read at each call, so its
// owner may replace it between steps; an empty slot: the calling thread); it must outlive the update.
std::unique_ptr<TierUpdate> MakeHostTierUpdate(const std::unique_ptr<HostExecutor>* executor);

// CUDA builds: the device tier of `device` (a CUDA device), made by the CUDA back-end module
// (tier_update_cuda.h); FailedPrecondition when the module is absent. Unimplemented on host builds.
absl::StatusOr<std::unique_ptr<TierUpdate>> MakeCudaTierUpdate(device::Device& device);

}  // namespace strata::optim
