#include "runtime/memory/tier_ops.h"

#include <cstring>

#include "kernels/cpu/tensor_ops.h"
#include "runtime/base/status.h"
#include "runtime/memory/cuda_backend.h"

namespace strata::memory {

namespace {

namespace kc = kernels::cpu;

// The same kernel calls as the host communicator's reductions (comm::AccumulateInto, comm::ScaleInPlace
// on fp32) and optim::SumSquares, so host results are the bits they always were.
class HostTierOps final : public TierOps {
 public:
  explicit HostTierOps(const HostThreads* threads) : threads_(threads) {}
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
      kc::Accumulate(kc::BestCpuKernels(), nullptr, src, dst, n);
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
    kc::Scale(kc::BestCpuKernels(), nullptr, p, p, n, factor);
    return absl::OkStatus();
  }
  absl::StatusOr<double> SumSquares(const float* p, size_t n) override { return kc::SumSquaresInOrder(p, n); }
  // The kernels' casts (bit-identical to the element math for every ISA and thread count), on the
  // threads when there are several.
  absl::Status Cast(DType to, const float* src, void* dst, size_t n) override {
    if (to == DType::kF32) return ToHost(dst, src, n * 4);
    uint16_t* out = static_cast<uint16_t*>(dst);
    const kc::CpuKernels& k =
        threads_ != nullptr && threads_->kernels != nullptr ? *threads_->kernels : kc::BestCpuKernels();
    kc::ThreadPool* pool = threads_ != nullptr ? threads_->pool : nullptr;
    if (to == DType::kBF16) {
      kc::CastToBf16(k, pool, src, out, n);
    } else {
      kc::CastToHalf(k, pool, src, out, n);
    }
    return absl::OkStatus();
  }

 private:
  const HostThreads* threads_;
};

}  // namespace

std::unique_ptr<TierOps> MakeHostTierOps(const HostThreads* threads) { return std::make_unique<HostTierOps>(threads); }

absl::StatusOr<std::unique_ptr<TierOps>> MakeCudaTierOps(device::Device& device) {
#if STRATA_WITH_CUDA
  STRATA_ASSIGN_OR_RETURN(const CudaMemoryApi* api, CudaMemoryBackend());
  return api->create_tier_ops(device);
#else
  (void)device;
  return absl::UnimplementedError("this build has no CUDA (STRATA_WITH_CUDA=OFF): the tiers are host memory");
#endif
}

}  // namespace strata::memory
