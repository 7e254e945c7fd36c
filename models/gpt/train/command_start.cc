#include "models/gpt/train/command_start.h"

namespace strata::tools {

absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const comm::Launch& launch, const TrainOptions& o,
                             const comm::Options& options) {
  return spec::StartJob<Compute>(mpi, launch, DeviceKindFor(o.device), options, [&](std::optional<int> local_rank) {
    return MakeCompute(o.device, o.matmul, o.attention, o.engine.param_dtype, local_rank);
  });
}

}  // namespace strata::tools
