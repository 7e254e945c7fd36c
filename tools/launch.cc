#include "tools/launch.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/env.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/nccl_backend.h"

namespace strata::tools {

// Note [Launchers]. The CLI runs one process per rank. Under mpirun or srun the MPI world is the job:
// the engine bootstraps NCCL over it on GPUs, and the host back-end's collectives are MPI's. Under
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and MPI a 1-rank singleton in each
// process) the job is the torchrun world: on GPUs rank 0's NCCL id travels over the TCP exchange
// (comm::CreateNcclFromTorchrun), the engine takes that NCCL world, and the command's own small
// collectives ride on it through a device bounce (comm::HostBuffersOverNccl). The host back-end has no
// collectives without MPI, so a torchrun launch of more than one rank on the host is refused with the
// way to launch it instead of running N separate 1-rank jobs. A torchrun launch is recognised by
// WORLD_SIZE: MASTER_ADDR and MASTER_PORT alone are often left in a shell by earlier PyTorch jobs.

absl::StatusOr<Launch> DetectLaunch(const comm::MpiRuntime& mpi) {
  Launch l{mpi.world_rank(), mpi.world_size(), std::nullopt};
  if (mpi.world_size() > 1) return l;
  absl::StatusOr<comm::TorchrunEnv> launch = comm::TorchrunLaunch();
  if (absl::IsNotFound(launch.status())) return l;
  STRATA_ASSIGN_OR_RETURN(comm::TorchrunEnv t, std::move(launch));
  l.rank = t.rank;
  l.size = t.world_size;
  l.torchrun = t;
  SetLogRank(t.rank);
  return l;
}

std::optional<std::string> RefuseHostUnderTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& command) {
  if (!launch.torchrun || launch.size == 1 || kind != device::DeviceKind::kHost) return std::nullopt;
  return absl::StrCat("started by torchrun (WORLD_SIZE=", launch.size, ") on the host back-end, whose collectives ",
                      "need MPI: launch it with `mpirun -n ", launch.size, " strata ", command,
                      " ...` (or srun), or run on GPUs (--device cuda), where torchrun's variables bootstrap NCCL");
}

absl::StatusOr<Job> StartJob(comm::MpiRuntime& mpi, const Launch& launch, const TrainOptions& o,
                             const comm::Options& options) {
  const bool nccl_world = launch.torchrun && DeviceKindFor(o.device) == device::DeviceKind::kCuda;
  Worlds worlds;
  if (!nccl_world) {  // MPI, or one torchrun rank on the host
    STRATA_ASSIGN_OR_RETURN(worlds.world, mpi.World(options));
  }
  const std::optional<int> local_rank = launch.torchrun ? std::optional<int>(launch.torchrun->local_rank) : std::nullopt;
  auto compute = MakeCompute(o.device, o.matmul, o.attention, o.engine.param_dtype, local_rank);
  if (!compute.ok()) {
    if (worlds.world != nullptr && worlds.world->size() > 1) {
      STRATA_LOG(Error) << "rank " << launch.rank << " failed: " << compute.status().message();
      worlds.world->Abort(compute.status());  // MPI_Abort: does not return
    }
    return compute.status();
  }
  if (nccl_world) {
#if STRATA_WITH_NCCL
    absl::StatusOr<const comm::NcclApi*> nccl = comm::NcclBackend();
    if (!nccl.ok()) return Annotate(nccl.status(), "a torchrun launch on GPUs");
    STRATA_ASSIGN_OR_RETURN(worlds.world, (*nccl)->create_from_torchrun(*launch.torchrun, options));
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> own, worlds.world->Dup("host-buffers", options.timeout_ms));
    STRATA_ASSIGN_OR_RETURN(worlds.host, (*nccl)->host_buffers_over_nccl(std::move(own)));
#else
    return absl::UnimplementedError("a torchrun launch on GPUs needs NCCL, and this build has none; use mpirun");
#endif
  }
  return Job{std::move(*compute), std::move(worlds)};
}

}  // namespace strata::tools
