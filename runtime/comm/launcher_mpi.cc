// The launcher's MPI half (launcher.h): DetectLaunch over an MpiRuntime and StartWorlds, in strata_comm_mpi
// with the MPI back-end, so that strata_comm (and libstrata.so) links no libmpi (docs/decisions/0041).
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/job_watch.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/nccl_backend.h"
#include "runtime/device/host_device.h"

namespace strata::comm {

absl::StatusOr<Launch> DetectLaunch(const MpiRuntime& mpi) {
  STRATA_ASSIGN_OR_RETURN(Launch l, DetectLaunch(mpi.world_rank(), mpi.world_size()));
  if (l.torchrun) SetLogRank(l.rank);
  return l;
}

namespace {

absl::Status StartNcclWorld(const Launch& launch, const Options& options, Worlds& worlds) {
#if STRATA_WITH_NCCL
  WatchTorchrunJobOrWarn(*launch.torchrun);  // Note [Job watch]
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

}  // namespace strata::comm
