// The device part of the CUDA back-end module (runtime/base/module.h): what the core asks of the CUDA
// runtime, through libstrata_cuda.so, so that nothing in the core links libcudart. The module fills the
// table from cuda_device.h (runtime/capi/cuda_module.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace strata::device {

struct CudaDeviceApi {
  static constexpr char kPart[] = "device";
  static constexpr uint32_t kVersion = 1;
  int (*device_count)();                                     // CudaDeviceCount()
  absl::StatusOr<int> (*current_ordinal)();                  // the calling thread's cudaGetDevice
  absl::StatusOr<std::unique_ptr<Device>> (*create)(int);   // CudaDevice::Create(ordinal)
  // cudaHostRegister / cudaHostUnregister of host memory; the error carries cudaGetErrorString's text
  // (and the sticky error is cleared).
  absl::Status (*host_register)(void* p, size_t bytes);
  void (*host_unregister)(void* p);
};

// The module's device part; FailedPrecondition naming the files tried when the module is absent.
absl::StatusOr<const CudaDeviceApi*> CudaDeviceBackend();

// Visible CUDA devices: 0 without a GPU, a driver, or the module (absent is not an error here: "auto" then
// means the host).
int CudaDeviceCountIfAvailable();

}  // namespace strata::device
