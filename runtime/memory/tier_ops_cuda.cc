// CudaTierOps (Note [Tier ops]): the device tier of a CUDA device, through the kernels/cuda twins of the
// host kernels (same element math, so a cast or a scale gives the host's bits; the sum of squares' order
// differs, see kernels/cuda/sum_squares.cuh). Part of the CUDA back-end module (tier_ops_cuda.h).
//
// Ordering. Blocking calls run on a private non-blocking stream of the engine's device and synchronise
// it before returning, so they are ordered after everything they themselves issued; work that other
// streams did on the same buffers must be complete first, which the engine guarantees (the step waits for
// the reduce stream, a gradient slot is zeroed only after its fence, exports run between steps).
// The optimizer's update over this tier is optim/tier_update_cuda.cc's, on a stream of its own.
// "On(stream)" calls enqueue on that stream's cudaStream_t; a launch error poisons the stream.
#include "runtime/memory/tier_ops_cuda.h"

#include <cuda_runtime.h>

#include "kernels/cuda/add.cuh"
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/scale.cuh"
#include "kernels/cuda/sum_squares.cuh"
#include "runtime/base/status.h"
#include "runtime/device/cuda_device.h"

namespace strata::memory {

namespace {

cudaStream_t Native(device::Stream& s) { return static_cast<device::CudaStream&>(s).native(); }

// A launch error becomes the stream's sticky error (the task fails when the stream reaches it). The
// message is made here: a stream's host function must not call the CUDA runtime (cudaGetErrorString).
void Poison(device::Stream& s, cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  s.Enqueue([status = device::CudaError(what, err, __FILE__, __LINE__)]() { return status; });
}

class CudaTierOps final : public TierOps {
 public:
  CudaTierOps(std::unique_ptr<device::Stream> stream, double* workspace)
      : stream_(std::move(stream)), native_(Native(*stream_)), workspace_(workspace) {}
  ~CudaTierOps() override {
    stream_->Synchronize().IgnoreError();
    cudaFree(workspace_);
  }

  bool host_visible() const override { return false; }

  absl::Status ToHost(void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, native_)));
    return Sync();
  }
  absl::Status FromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, native_)));
    return Sync();
  }
  absl::Status Zero(void* p, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemsetAsync(p, 0, bytes, native_)));
    return Sync();
  }
  void AccumulateOn(device::Stream& stream, float* dst, const float* src, size_t n) override {
    Poison(stream, kernels::cuda::LaunchAddInto(dst, src, n, Native(stream)), "LaunchAddInto");
  }
  void ToHostOn(device::Stream& stream, void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Poison(stream, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, Native(stream)), "cudaMemcpyAsync(D2H)");
  }
  void FromHostOn(device::Stream& stream, void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    Poison(stream, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, Native(stream)), "cudaMemcpyAsync(H2D)");
  }
  absl::Status Scale(float* p, size_t n, float factor) override {
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(kernels::cuda::LaunchScale(p, p, n, factor, native_)));
    return Sync();
  }
  absl::StatusOr<double> SumSquares(const float* p, size_t n) override {
    double* out = workspace_ + kernels::cuda::kSumSquaresBlocks;
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(kernels::cuda::LaunchSumSquares(p, n, workspace_, out, native_)));
    double host = 0;
    STRATA_RETURN_IF_ERROR(ToHost(&host, out, sizeof(host)));
    return host;
  }
  absl::Status Cast(DType to, const float* src, void* dst, size_t n) override {
    if (n == 0) return absl::OkStatus();
    if (to == DType::kF32) {
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, native_)));
    } else {
      const kernels::ParamCopy mode = to == DType::kBF16 ? kernels::ParamCopy::kBf16 : kernels::ParamCopy::kF16;
      STRATA_RETURN_IF_ERROR(
          STRATA_CUDA_CALL(kernels::cuda::LaunchCast(src, static_cast<uint16_t*>(dst), n, mode, native_)));
    }
    return Sync();
  }

 private:
  absl::Status Sync() { return STRATA_CUDA_CALL(cudaStreamSynchronize(native_)); }

  std::unique_ptr<device::Stream> stream_;
  cudaStream_t native_;
  double* workspace_;  // kSumSquaresBlocks partial sums, then the result
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierOps>> CreateCudaTierOps(device::Device& device) {
  if (device.kind() != device::DeviceKind::kCuda) {
    return absl::InvalidArgumentError("MakeCudaTierOps needs a CUDA device");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream("tier-ops"));
  // The norm's workspace: 8 KiB, outside the device arena (it exists before the arena's budget is
  // split among the units, and is the same for every model).
  void* workspace = nullptr;
  STRATA_RETURN_IF_ERROR(
      STRATA_CUDA_CALL(cudaMalloc(&workspace, kernels::cuda::SumSquaresWorkspaceBytes() + sizeof(double))));
  return std::unique_ptr<TierOps>(new CudaTierOps(std::move(stream), static_cast<double*>(workspace)));
}

}  // namespace strata::memory
