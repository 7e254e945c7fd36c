#include "runtime/comm/launcher.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

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

}  // namespace strata::comm
