#include "runtime/comm/mpi_backend.h"

#include "runtime/base/module.h"

namespace strata::comm {

absl::StatusOr<const MpiApi*> MpiBackend() { return module::MpiModuleApi<MpiApi>(); }

}  // namespace strata::comm
