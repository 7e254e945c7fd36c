#include "tools/launch.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::tools {

std::optional<std::string> RefuseHostUnderTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& command) {
  return comm::RefuseHostTorchrun(launch, kind, absl::StrCat("strata ", command));
}

absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const Launch& launch, const TrainOptions& o,
                             const comm::Options& options) {
  const std::optional<int> local_rank =
      launch.torchrun ? std::optional<int>(launch.torchrun->local_rank) : std::nullopt;
  absl::StatusOr<Compute> compute = absl::UnknownError("the device was not started");
  STRATA_ASSIGN_OR_RETURN(Worlds worlds, comm::StartWorlds(mpi, launch, DeviceKindFor(o.device), options, [&] {
    compute = MakeCompute(o.device, o.matmul, o.attention, o.engine.param_dtype, local_rank);
    return compute.status();
  }));
  return Job{std::move(*compute), std::move(worlds)};
}

}  // namespace strata::tools
