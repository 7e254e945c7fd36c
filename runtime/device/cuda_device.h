// The CUDA implementation of Device / Stream / Event (device.h), and the call-site wrapper for the CUDA
// runtime. Built only with STRATA_WITH_CUDA, into the CUDA back-end module (the core reaches it through
// cuda_backend.h); the host implementation serves everything else.
//
// Streams are non-blocking cudaStream_t; events are cudaEvent_t (timing disabled: completed_ns() is 0,
// timelines on GPU come from host-side stamps). Enqueue runs a HostTask through cudaLaunchHostFunc; a
// task that fails makes the stream's status sticky, and Synchronize() returns it together with any CUDA
// error. Device memory comes from memory::CudaArenaAllocator (one cudaMalloc per budget).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace strata::device {

absl::Status CudaError(const char* call, cudaError_t err, const char* file, int line);

}  // namespace strata::device

#define STRATA_CUDA_CALL(call)                                                         \
  ([&]() -> ::absl::Status {                                                           \
    const cudaError_t strata_cuda_err_ = (call);                                       \
    if (strata_cuda_err_ != cudaSuccess)                                               \
      return ::strata::device::CudaError(#call, strata_cuda_err_, __FILE__, __LINE__); \
    return ::absl::OkStatus();                                                         \
  }())

namespace strata::device {

class CudaEvent final : public Event {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEvent>> Create();
  ~CudaEvent() override;
  absl::Status Synchronize() override;
  bool Query() override;
  int64_t completed_ns() const override { return 0; }
  cudaEvent_t native() const { return event_; }

 private:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_;
};

class CudaStream final : public Stream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(std::string name);
  ~CudaStream() override;
  absl::string_view name() const override { return name_; }
  void Enqueue(HostTask task) override;
  void Record(Event& event) override;
  void WaitFor(Event& event) override;
  absl::Status Synchronize() override;
  absl::Status status() override;  // host-side: failed tasks and CUDA calls made through this class
  // Makes `s` the sticky status now, unless the stream failed before (a collective refused before it
  // reached the device). Later host tasks are skipped; work already on the device still runs.
  void Fail(absl::Status s);
  cudaStream_t native() const { return stream_; }

 private:
  CudaStream(std::string name, cudaStream_t s) : name_(std::move(name)), stream_(s) {}
  const std::string name_;
  cudaStream_t stream_;
  std::mutex mu_;
  absl::Status status_;  // sticky: the first failure of a task or a CUDA call
};

class CudaDevice final : public Device {
 public:
  // Selects `ordinal` for the calling thread (cudaSetDevice) and keeps it for its streams.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) override;
  std::unique_ptr<Event> CreateEvent() override;  // nullptr when CUDA refuses (out of resources)
  int ordinal() const { return ordinal_; }

 private:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  int ordinal_;
};

// Number of visible CUDA devices (0 when there is no driver or no device).
int CudaDeviceCount();

}  // namespace strata::device
