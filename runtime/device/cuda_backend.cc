#include "runtime/device/cuda_backend.h"

#include "runtime/base/module.h"

namespace strata::device {

absl::StatusOr<const CudaDeviceApi*> CudaDeviceBackend() { return module::CudaModuleApi<CudaDeviceApi>(); }

int CudaDeviceCountIfAvailable() {
  absl::StatusOr<const CudaDeviceApi*> api = CudaDeviceBackend();
  return api.ok() ? (*api)->device_count() : 0;
}

}  // namespace strata::device
