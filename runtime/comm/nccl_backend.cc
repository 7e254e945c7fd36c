#include "runtime/comm/nccl_backend.h"

#include "runtime/base/module.h"

namespace strata::comm {

absl::StatusOr<const NcclApi*> NcclBackend() { return module::CudaModuleApi<NcclApi>(); }

}  // namespace strata::comm
