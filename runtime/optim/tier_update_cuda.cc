// CudaTierUpdate (optim/tier_update.h): the optimizer's update over the device tier of a CUDA device,
// through the kernels/cuda twins of the host kernels (same element math, so an update gives the host's
// bits). Part of the CUDA back-end module (tier_update_cuda.h).
//
// Ordering. Update runs on a private non-blocking stream of the device and synchronises it before
// returning, as the tier's blocking operations do on theirs (runtime/memory/tier_ops_cuda.cc); work that
// other streams did on the same buffers must be complete first, which the engine guarantees (the step
// waits for the reduce stream).
#include "runtime/optim/tier_update_cuda.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "kernels/common/optimizer_arrays.h"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/sgd.cuh"
#include "runtime/base/status.h"
#include "runtime/device/cuda_device.h"

namespace strata::optim {

namespace {

class CudaTierUpdate final : public TierUpdate {
 public:
  explicit CudaTierUpdate(std::unique_ptr<device::Stream> stream)
      : stream_(std::move(stream)), native_(static_cast<device::CudaStream&>(*stream_).native()) {}
  ~CudaTierUpdate() override { stream_->Synchronize().IgnoreError(); }

  absl::Status Update(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                      absl::Span<const GroupHyper> groups, int64_t step, float grad_scale, uint16_t* param_copy,
                      DType copy_dtype) override {
    kernels::OptimizerArrays a{s.master, s.grad, s.m, s.v, nullptr, kernels::ParamCopy::kNone};
    if (param_copy != nullptr && copy_dtype != DType::kF32) {
      a.param_copy = param_copy;
      a.copy = copy_dtype == DType::kBF16 ? kernels::ParamCopy::kBf16 : kernels::ParamCopy::kF16;
    }
    // The same per-segment coefficients as the host: SegmentAdamWStep / SegmentSgdStep, with the
    // segment's param group (Note [Param groups]) and its own step count where it has one (Note [Parameters
    // without a gradient]).
    for (const shard::Segment& seg : segs) {
      if (seg.group < 0 || static_cast<size_t>(seg.group) >= groups.size()) {
        return absl::InternalError(
            absl::StrCat("a segment of param group ", seg.group, " in an update of ", groups.size(), " groups"));
      }
      const GroupHyper& g = groups[seg.group];
      if (cfg.type == OptimizerType::kAdamW) {
        const kernels::AdamWCoeffs<float> c = kernels::AdamWCoeffsOf(SegmentAdamWStep(cfg, g, seg, step));
        STRATA_RETURN_IF_ERROR(
            STRATA_CUDA_CALL(kernels::cuda::LaunchAdamW(a, seg.begin, seg.end, c, grad_scale, native_)));
      } else {
        STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(
            kernels::cuda::LaunchSgd(a, seg.begin, seg.end, SegmentSgdStep(cfg, g, seg), grad_scale, native_)));
      }
    }
    return STRATA_CUDA_CALL(cudaStreamSynchronize(native_));
  }

 private:
  std::unique_ptr<device::Stream> stream_;
  cudaStream_t native_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierUpdate>> CreateCudaTierUpdate(device::Device& device) {
  if (device.kind() != device::DeviceKind::kCuda) {
    return absl::InvalidArgumentError("MakeCudaTierUpdate needs a CUDA device");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream("tier-update"));
  return std::unique_ptr<TierUpdate>(new CudaTierUpdate(std::move(stream)));
}

}  // namespace strata::optim
