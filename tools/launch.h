// How a multi-process CLI command (`strata train`, `strata bench step`) finds its job and its
// communicators: mpirun / srun, or torchrun (Note [Launchers] in launch.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/device.h"
#include "tools/compute.h"

namespace strata::tools {

struct Launch {
  int rank = 0;
  int size = 1;
  std::optional<comm::TorchrunEnv> torchrun;  // set for a torchrun launch
};

// The MPI world when it has more than one rank; else a torchrun launch when WORLD_SIZE is set (its
// variables validated, errors naming them); else MPI's one rank.
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

// Collective. Call after RefuseHostUnderTorchrun said nothing.
absl::StatusOr<Worlds> MakeWorlds(comm::MpiRuntime& mpi, const Launch& launch, const Compute& compute,
                                  const comm::Options& options);

}  // namespace strata::tools
