#include "runtime/memory/cuda_backend.h"

#include "runtime/base/module.h"

namespace strata::memory {

absl::StatusOr<const CudaMemoryApi*> CudaMemoryBackend() { return module::CudaModuleApi<CudaMemoryApi>(); }

}  // namespace strata::memory
