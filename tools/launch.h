// How a multi-process CLI command (`strata train`, `bench step`, `bench capacity`) finds its job, its
// device and its communicators: the runtime's launcher (runtime/comm/launcher.h, Note [Launchers]) with
// the CLI's device and GPT back-end (compute.h).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/train_options.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/device.h"

namespace strata::tools {

using comm::DetectLaunch;
using comm::Launch;
using comm::Worlds;

// comm::RefuseHostTorchrun for `strata <command>`.
std::optional<std::string> RefuseHostUnderTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& command);

// What a command runs on. `worlds` is declared last, so its communicators go before the device.
struct Job {
  Compute compute;
  Worlds worlds;
};

// Collective; call after RefuseHostUnderTorchrun said nothing. comm::StartWorlds with the device of
// `o.device` (under torchrun the GPU of its LOCAL_RANK) as the device bring-up.
absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const Launch& launch, const TrainOptions& o,
                             const comm::Options& options);

}  // namespace strata::tools
