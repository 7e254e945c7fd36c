// Communicators over MPI state that the host trainer owns: an MPI it initialised itself, and any of its
// MPI communicators (the C ABI's strata_comm_create_mpi / strata_comm_create_mpi_world).
//
// comm::MpiRuntime covers the other case, where Strata initialises MPI itself; it has no way to adopt
// an MPI that is already initialised or a communicator other than MPI_COMM_WORLD, and runtime/comm is
// not the C ABI's to change, so the adopting communicator lives here. It follows the MpiCommunicator
// contract (non-blocking MPI collectives polled against the deadline, bf16 / fp16 sums through custom
// ops), except that a timeout names the collective and the deadline but not the unresponsive ranks
// (MpiRuntime's liveness exchange needs its private control communicator). Folding it into
// runtime/comm as MpiRuntime::Adopt would remove that difference.
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
