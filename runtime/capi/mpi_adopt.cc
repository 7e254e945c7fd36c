// Communicators over host-owned MPI state, through comm::MpiRuntime::Adopt (see mpi_adopt.h).
#include "runtime/capi/mpi_adopt.h"

#include "runtime/base/status.h"
#include "runtime/comm/mpi_communicator.h"

namespace strata::capi {

absl::StatusOr<bool> MpiInitialized() { return comm::MpiRuntime::IsInitialized(); }

int MpiWorldFortranHandle() { return comm::MpiRuntime::WorldFortranHandle(); }

absl::StatusOr<std::unique_ptr<comm::Communicator>> AdoptMpiComm(int fortran_handle, const comm::Options& options) {
  STRATA_ASSIGN_OR_RETURN(const bool initialized, MpiInitialized());
  if (!initialized) {
    return absl::FailedPreconditionError(
        "MPI is not initialised: initialise it with MPI_THREAD_MULTIPLE first, or use strata_comm_create_mpi_world, "
        "which initialises it");
  }
  // The adopted runtime never finalises MPI; the communicator keeps the shared context (custom ops,
  // liveness channel) alive after the runtime object goes.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::MpiRuntime> runtime, comm::MpiRuntime::Adopt());
  return runtime->Wrap(fortran_handle, options);
}

}  // namespace strata::capi
