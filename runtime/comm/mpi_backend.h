// The MPI back-end module's part (runtime/base/module.h, docs/decisions/0041-mpi-backend-module.md): the MPI
// communicators the C ABI makes, created in libstrata_mpi.so (mpi_communicator.h), so that libstrata.so links
// no libmpi and loads on a machine without MPI. The CLI, the examples and the tests link the MPI back-end
// (strata_comm_mpi) directly and do not use this.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

class MpiRuntime;  // mpi_communicator.h; made and destroyed only inside the module

// Each entry is the function of mpi_communicator.h (MpiRuntime) or runtime/capi/mpi_adopt.h with its contract.
struct MpiApi {
  static constexpr char kPart[] = "mpi";
  static constexpr uint32_t kVersion = 1;
  absl::StatusOr<bool> (*is_initialized)();  // MpiRuntime::IsInitialized
  int (*world_fortran_handle)();             // MpiRuntime::WorldFortranHandle
  // MpiRuntime::Init(nullptr, nullptr); the runtime finalises MPI when the last reference goes.
  absl::StatusOr<std::shared_ptr<MpiRuntime>> (*init)();
  absl::StatusOr<std::unique_ptr<Communicator>> (*world)(MpiRuntime& runtime, const Options& options);
  // capi::AdoptMpiComm: a duplicate of the host's communicator (Fortran handle); MPI initialised by the host.
  absl::StatusOr<std::unique_ptr<Communicator>> (*adopt)(int fortran_handle, const Options& options);
};

// The module's MPI part; FailedPrecondition naming the files tried, dlerror()'s text (e.g. libmpi.so.40 not
// found) and the fix when the module cannot be loaded.
absl::StatusOr<const MpiApi*> MpiBackend();

}  // namespace strata::comm
