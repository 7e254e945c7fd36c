// How a multi-process program finds its job and brings up its communicators: mpirun / srun, or torchrun
// (Note [Launchers] in launcher.cc). One copy for the CLI (spec/launch.h), the C ABI
// (strata_comm_create_mpi_world) and the examples (mlp_train).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#if STRATA_WITH_MPI
#include "runtime/comm/mpi_communicator.h"
#endif

namespace strata::comm {

struct Launch {
  int rank = 0;
  int size = 1;
  std::optional<TorchrunEnv> torchrun;  // set for a torchrun launch
};

// The choice itself: the MPI world when it has more than one rank; else the torchrun launch `torchrun`
// describes (TorchrunLaunch(): NotFound when it is none, an error naming a malformed variable is returned);
// else MPI's one rank. Pure: no environment read, no logging.
absl::StatusOr<Launch> ChooseLaunch(int mpi_rank, int mpi_size, const absl::StatusOr<TorchrunEnv>& torchrun);

// Why `invocation` (the command line's program and command, e.g. "strata train") cannot run as launched:
// a torchrun launch of more than one rank on the host back-end (`kind`), whose collectives need MPI (the
// message names the mpirun command); nullopt when it can.
std::optional<std::string> RefuseHostTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& invocation);

// The engine's world, and a communicator on host buffers for the program's own small collectives
// (metrics, trace), which is the world itself unless the world is NCCL.
struct Worlds {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> host;  // null: `world` takes host buffers itself
  Communicator& host_buffers() { return host ? *host : *world; }
};

// ChooseLaunch over what MPI sees and the environment (TorchrunLaunch, read only when MPI's world is one
// rank: under mpirun the variables are not ours).
absl::StatusOr<Launch> DetectLaunch(int mpi_rank, int mpi_size);

#if STRATA_WITH_MPI
// The two below are the launcher's MPI half, defined in launcher_mpi.cc: they are in strata_comm_mpi (which
// links libmpi) with the MPI back-end, for the programs that link it (the CLI, mlp_train), not in strata_comm.
//
// DetectLaunch over `mpi`'s world; a torchrun launch's rank becomes the log lines' rank.
absl::StatusOr<Launch> DetectLaunch(const MpiRuntime& mpi);

// Collective; call after RefuseHostTorchrun said nothing. The communicators of a job on `kind`, with
// the caller's device bring-up `start_device` (under torchrun on CUDA it selects the GPU of LOCAL_RANK) run
// in an order that strands no rank: under MPI the world first, so that a rank whose device fails to start
// aborts the job (MPI_Abort) instead of leaving the others in MPI's communicator creation, which has no
// deadline; under torchrun on CUDA the device first, since NCCL's initialisation runs on it, then the NCCL
// world from the CUDA back-end module (runtime/base/module.h).
absl::StatusOr<Worlds> StartWorlds(MpiRuntime& mpi, const Launch& launch, device::DeviceKind kind,
                                   const Options& options, absl::FunctionRef<absl::Status()> start_device);
#endif

}  // namespace strata::comm
