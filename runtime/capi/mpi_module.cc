// The entry point of libstrata_mpi.so, the MPI back-end module (runtime/base/module.h,
// docs/decisions/0041-mpi-backend-module.md): the identity part and the MPI part (runtime/comm/mpi_backend.h) over
// MpiRuntime (mpi_communicator.h) and the adopter of host-owned MPI (mpi_adopt.h). Everything of libstrata that
// links libmpi is here; libstrata.so loads it when an MPI communicator is first asked for.
#include <iterator>
#include <memory>

#include "runtime/base/logging.h"
#include "runtime/base/module.h"
#include "runtime/base/status.h"
#include "runtime/capi/mpi_adopt.h"
#include "runtime/comm/mpi_backend.h"
#include "runtime/comm/mpi_communicator.h"

namespace strata::mpi_module {
namespace {

absl::StatusOr<std::shared_ptr<comm::MpiRuntime>> Init() {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::MpiRuntime> runtime, comm::MpiRuntime::Init(nullptr, nullptr));
  return std::shared_ptr<comm::MpiRuntime>(std::move(runtime));  // its deleter, MPI_Finalize included, is ours
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> World(comm::MpiRuntime& runtime, const comm::Options& options) {
  return runtime.World(options);
}

const module::ModuleIdentity kIdentity{module::BuildId(), &SetLogRank};
const comm::MpiApi kMpi{&comm::MpiRuntime::IsInitialized, &comm::MpiRuntime::WorldFortranHandle, &Init, &World,
                        &capi::AdoptMpiComm};

const module::PartEntry kParts[] = {
    {module::ModuleIdentity::kPart, module::ModuleIdentity::kVersion, &kIdentity},
    {comm::MpiApi::kPart, comm::MpiApi::kVersion, &kMpi},
};

}  // namespace
}  // namespace strata::mpi_module

extern "C" __attribute__((visibility("default"))) const void* strata_mpi_module_part(const char* name, uint32_t version,
                                                                                     uint32_t* has_version) {
  return strata::module::FindPart(strata::mpi_module::kParts, std::size(strata::mpi_module::kParts), name, version,
                                  has_version);
}
