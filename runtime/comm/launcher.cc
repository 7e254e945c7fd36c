#include "runtime/comm/launcher.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/nccl_backend.h"
#include "runtime/device/host_device.h"

namespace strata::comm {

// Note [Launchers]. A program runs one process per rank. Under mpirun or srun the MPI world is the job:
// the engine bootstraps NCCL over it on GPUs, and the host back-end's collectives are MPI's. Under
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and MPI a 1-rank singleton in each
// process) the job is the torchrun world: on GPUs rank 0's NCCL id travels over torchrun's store
// (CreateNcclFromTorchrun, Note [Bootstrap over the store]), the engine takes that NCCL world, and the
// program's own small collectives ride on it through a device bounce (HostBuffersOverNccl). The host back-end has no
// collectives without MPI, so a torchrun launch of more than one rank on the host is refused with the way to launch it
// instead of running N separate 1-rank jobs. A torchrun launch is recognised by WORLD_SIZE: MASTER_ADDR and MASTER_PORT
// alone are often left in a shell by earlier PyTorch jobs (TorchrunLaunch).

absl::StatusOr<Launch> ChooseLaunch(int mpi_rank, int mpi_size, const absl::StatusOr<TorchrunEnv>& torchrun) {
  Launch l{mpi_rank, mpi_size, std::nullopt};
  if (mpi_size > 1 || absl::IsNotFound(torchrun.status())) return l;
  if (!torchrun.ok()) return torchrun.status();
  l.rank = torchrun->rank;
  l.size = torchrun->world_size;
  l.torchrun = *torchrun;
  return l;
}

std::optional<std::string> RefuseHostTorchrun(const Launch& launch, device::DeviceKind kind,
                                                   const std::string& invocation) {
  if (!launch.torchrun || launch.size == 1 || kind != device::DeviceKind::kHost) return std::nullopt;
  return absl::StrCat("started by torchrun (WORLD_SIZE=", launch.size, ") on the host back-end, whose collectives ",
                      "need MPI: launch it with `mpirun -n ", launch.size, " ", invocation,
                      " ...` (or srun), or run on GPUs (--device cuda), where torchrun's variables bootstrap NCCL");
}

absl::StatusOr<Launch> DetectLaunch(int mpi_rank, int mpi_size) {
  if (mpi_size > 1) return ChooseLaunch(mpi_rank, mpi_size, absl::NotFoundError("an MPI launch"));
  return ChooseLaunch(mpi_rank, mpi_size, TorchrunLaunch());
}

#if STRATA_WITH_MPI
absl::StatusOr<Launch> DetectLaunch(const MpiRuntime& mpi) {
  STRATA_ASSIGN_OR_RETURN(Launch l, DetectLaunch(mpi.world_rank(), mpi.world_size()));
  if (l.torchrun) SetLogRank(l.rank);
  return l;
}

namespace {

absl::Status StartNcclWorld(const Launch& launch, const Options& options, Worlds& worlds) {
#if STRATA_WITH_NCCL
  absl::StatusOr<const NcclApi*> nccl = NcclBackend();
  if (!nccl.ok()) return Annotate(nccl.status(), "a torchrun launch on GPUs");
  STRATA_ASSIGN_OR_RETURN(worlds.world, (*nccl)->create_from_torchrun(*launch.torchrun, options));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> own, worlds.world->Dup("host-buffers", options.timeout_ms));
  STRATA_ASSIGN_OR_RETURN(worlds.host, (*nccl)->host_buffers_over_nccl(std::move(own)));
  return absl::OkStatus();
#else
  (void)launch, (void)options, (void)worlds;
  return absl::UnimplementedError("a torchrun launch on GPUs needs NCCL, and this build has none; use mpirun");
#endif
}

}  // namespace

absl::StatusOr<Worlds> StartWorlds(MpiRuntime& mpi, const Launch& launch, device::DeviceKind kind,
                                   const Options& options, absl::FunctionRef<absl::Status()> start_device) {
  const bool nccl_world = launch.torchrun && kind == device::DeviceKind::kCuda;
  Worlds worlds;
  if (!nccl_world) {  // MPI, or one torchrun rank on the host
    STRATA_ASSIGN_OR_RETURN(worlds.world, mpi.World(options));
  }
  absl::Status started = start_device();
  if (worlds.world != nullptr && worlds.world->size() > 1) {
    // Note [Agreed outcomes]: a device that fails on one rank (a GPU taken, a driver missing on one node)
    // stops every rank at once, each naming that rank and its cause.
    device::HostDevice host;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, host.CreateStream("start"));
    started = AgreeOnOutcome(started, "starting the device", *worlds.world, *stream);
  }
  STRATA_RETURN_IF_ERROR(started);
  if (nccl_world) STRATA_RETURN_IF_ERROR(StartNcclWorld(launch, options, worlds));
  return worlds;
}
#endif

}  // namespace strata::comm
