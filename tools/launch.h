// How a multi-process CLI command (`strata train`, `bench step`, `bench capacity`) finds its job, its
// device and its communicators: mpirun / srun, or torchrun (Note [Launchers] in launch.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/train_options.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/device.h"

namespace strata::tools {

struct Launch {
  int rank = 0;
  int size = 1;
  std::optional<comm::TorchrunEnv> torchrun;  // set for a torchrun launch
};

// The MPI world when an MPI launcher started this process or MPI sees more than one rank; else a
// torchrun launch when WORLD_SIZE is set (its variables validated, errors naming them; log lines then
// carry the torchrun rank); else MPI's one rank.
absl::StatusOr<Launch> DetectLaunch(const comm::MpiRuntime& mpi);

// Why `strata <command>` cannot run as launched: a torchrun launch of more than one rank on the host
// back-end (`kind`), whose collectives need MPI (the message names the mpirun command); nullopt when it can.
std::optional<std::string> RefuseHostUnderTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& command);

// The engine's world, and a communicator on host buffers for the command's own small collectives
// (metrics, trace), which is the world itself unless the world is NCCL.
struct Worlds {
  std::unique_ptr<comm::Communicator> world;
  std::unique_ptr<comm::Communicator> host;  // null: `world` takes host buffers itself
  comm::Communicator& host_buffers() { return host ? *host : *world; }
};

// What a command runs on. `worlds` is declared last, so its communicators go before the device.
struct Job {
  Compute compute;
  Worlds worlds;
};

// Collective; call after RefuseHostUnderTorchrun said nothing. The device of `o.device` (under torchrun
// the GPU of its LOCAL_RANK) and the communicators, in an order that strands no rank: under MPI the
// world first, so that a rank whose device fails to start aborts the job (MPI_Abort) instead of leaving
// the others in MPI's communicator creation, which has no deadline; under torchrun the device first,
// since NCCL's initialisation runs on it.
absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const Launch& launch, const TrainOptions& o,
                             const comm::Options& options);

}  // namespace strata::tools
