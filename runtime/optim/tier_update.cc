#include "runtime/optim/tier_update.h"

#include "runtime/base/module.h"
#include "runtime/base/status.h"
#include "runtime/optim/tier_update_cuda.h"

namespace strata::optim {

namespace {

class HostTierUpdate final : public TierUpdate {
 public:
  explicit HostTierUpdate(const std::unique_ptr<HostExecutor>* executor) : executor_(executor) {}
  absl::Status Update(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                      absl::Span<const GroupHyper> groups, int64_t step, float grad_scale, uint16_t* param_copy,
                      DType copy_dtype) override {
    UpdateOptions opts;
    opts.executor = executor_ != nullptr ? executor_->get() : nullptr;
    if (param_copy != nullptr && copy_dtype != DType::kF32) {
      opts.param_copy = param_copy;
      opts.param_copy_dtype = copy_dtype;
    }
    ApplyUpdate(cfg, s, segs, groups, step, grad_scale, opts);
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<HostExecutor>* executor_;
};

}  // namespace

std::unique_ptr<TierUpdate> MakeHostTierUpdate(const std::unique_ptr<HostExecutor>* executor) {
  return std::make_unique<HostTierUpdate>(executor);
}

absl::StatusOr<std::unique_ptr<TierUpdate>> MakeCudaTierUpdate(device::Device& device) {
#if STRATA_WITH_CUDA
  STRATA_ASSIGN_OR_RETURN(const CudaTierUpdateApi* api, module::CudaModuleApi<CudaTierUpdateApi>());
  return api->create(device);
#else
  (void)device;
  return absl::UnimplementedError("this build has no CUDA (STRATA_WITH_CUDA=OFF): the optimizer runs on the host");
#endif
}

}  // namespace strata::optim
