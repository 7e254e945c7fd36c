// The job of `strata train`, the GPT's command that runs one process per rank: after its start
// (spec/launch.h: MPI, the launch, the options agreed by every rank), the communicators with the GPT's
// device and back-end (compute.h).
#pragma once

#include "absl/status/statusor.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/train_options.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/mpi_communicator.h"
#include "spec/launch.h"

namespace strata::tools {

using Job = spec::Job<Compute>;

// Collective; call after spec::SetupForLaunch. spec::StartJob with the device of `o.device` (under torchrun
// the GPU of its LOCAL_RANK) and the GPT's back-end for it.
absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const comm::Launch& launch, const TrainOptions& o,
                             const comm::Options& options);

}  // namespace strata::tools
