// Communicators over MPI state that the host trainer owns: an MPI it initialised itself, and any of its
// MPI communicators (the C ABI's strata_comm_create_mpi / strata_comm_create_mpi_world).
//
// Thin wrappers over comm::MpiRuntime::Adopt / Wrap in the C ABI's terms (Fortran handles). A timeout's
// liveness check names unresponsive peers by their MPI_COMM_WORLD rank.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::capi {

// OK(true) when MPI is initialised and not finalised, OK(false) when not initialised yet, and
// FailedPrecondition once it was finalised (MPI cannot be initialised twice).
absl::StatusOr<bool> MpiInitialized();

// Collective over the communicator with Fortran handle `fortran_handle` (MPI_Comm_c2f). Duplicates it, so
// the caller keeps ownership of its own. MPI must be initialised with MPI_THREAD_MULTIPLE.
absl::StatusOr<std::unique_ptr<comm::Communicator>> AdoptMpiComm(int fortran_handle, const comm::Options& options);

// The Fortran handle of MPI_COMM_WORLD.
int MpiWorldFortranHandle();

}  // namespace strata::capi
