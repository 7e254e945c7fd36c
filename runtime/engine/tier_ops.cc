#include "runtime/engine/tier_ops.h"

#include <cstring>

#include "kernels/cpu/tensor_ops.h"
#include "runtime/base/module.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/engine/tier_ops_cuda.h"

namespace strata::engine {

namespace {

class HostTierOps final : public TierOps {
 public:
  explicit HostTierOps(const std::unique_ptr<optim::HostExecutor>* executor) : executor_(executor) {}
  bool host_visible() const override { return true; }
  absl::Status ToHost(void* host, const void* src, size_t bytes) override {
    if (bytes != 0 && host != src) std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status FromHost(void* dst, const void* host, size_t bytes) override { return ToHost(dst, host, bytes); }
  absl::Status Zero(void* p, size_t bytes) override {
    if (bytes != 0) std::memset(p, 0, bytes);
    return absl::OkStatus();
  }
  void AccumulateOn(device::Stream& stream, float* dst, const float* src, size_t n) override {
    stream.Enqueue([dst, src, n]() {
      comm::AccumulateInto(dst, src, n, DType::kF32);
      return absl::OkStatus();
    });
  }
  void ToHostOn(device::Stream& stream, void* host, const void* src, size_t bytes) override {
    stream.Enqueue([host, src, bytes]() {
      if (bytes != 0 && host != src) std::memcpy(host, src, bytes);
      return absl::OkStatus();
    });
  }
  void FromHostOn(device::Stream& stream, void* dst, const void* host, size_t bytes) override {
    ToHostOn(stream, dst, host, bytes);
  }
  absl::Status Scale(float* p, size_t n, float factor) override {
    comm::ScaleInPlace(p, n, DType::kF32, factor);
    return absl::OkStatus();
  }
  absl::StatusOr<double> SumSquares(const float* p, size_t n) override { return optim::SumSquares(p, n); }
  absl::Status Update(const optim::OptimizerConfig& cfg, const optim::ShardState& s,
                      const std::vector<shard::Segment>& segs, absl::Span<const optim::GroupHyper> groups, int64_t step,
                      float grad_scale, uint16_t* param_copy, DType copy_dtype) override {
    optim::UpdateOptions opts;
    opts.executor = executor_->get();
    if (param_copy != nullptr && copy_dtype != DType::kF32) {
      opts.param_copy = param_copy;
      opts.param_copy_dtype = copy_dtype;
    }
    optim::ApplyUpdate(cfg, s, segs, groups, step, grad_scale, opts);
    return absl::OkStatus();
  }
  // The kernels' casts (bit-identical to the element math for every ISA and thread count), on the
  // optimizer threads when there are several.
  absl::Status Cast(DType to, const float* src, void* dst, size_t n) override {
    if (to == DType::kF32) return ToHost(dst, src, n * 4);
    uint16_t* out = static_cast<uint16_t*>(dst);
    optim::HostExecutor* ex = executor_->get();
    const kernels::cpu::CpuKernels& k = ex != nullptr ? ex->kernels() : kernels::cpu::BestCpuKernels();
    kernels::cpu::ThreadPool* pool = ex != nullptr ? ex->pool() : nullptr;
    if (to == DType::kBF16) {
      kernels::cpu::CastToBf16(k, pool, src, out, n);
    } else {
      kernels::cpu::CastToHalf(k, pool, src, out, n);
    }
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<optim::HostExecutor>* executor_;
};

}  // namespace

std::unique_ptr<TierOps> MakeHostTierOps(const std::unique_ptr<optim::HostExecutor>* executor) {
  return std::make_unique<HostTierOps>(executor);
}

absl::StatusOr<std::unique_ptr<TierOps>> MakeCudaTierOps(device::Device& device) {
#if STRATA_WITH_CUDA
  STRATA_ASSIGN_OR_RETURN(const CudaTierOpsApi* api, module::CudaModuleApi<CudaTierOpsApi>());
  return api->create(device);
#else
  (void)device;
  return absl::UnimplementedError("this build has no CUDA (STRATA_WITH_CUDA=OFF): the engine runs on the host");
#endif
}

}  // namespace strata::engine
