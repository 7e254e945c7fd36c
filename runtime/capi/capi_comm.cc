// strata_comm_*: communicators over MPI (initialised by Strata or adopted from the host), in-process
// groups, and NCCL communicators adopted from the embedder (CUDA builds).
//
// Note [Process-wide MPI runtime]. MPI_Init / MPI_Finalize are process state by MPI's own definition
// (once each per process), so when Strata initialises MPI the runtime object is shared by every world
// communicator created that way, through the one process-wide weak reference below; MPI is finalised
// when the last of them is destroyed. When the host initialised MPI, Strata adopts it and never
// finalises it. Every MPI call goes through the MPI back-end module libstrata_mpi.so (comm::MpiBackend;
// docs/decisions/0041-mpi-backend-module.md): libstrata.so links no libmpi, and the module is loaded on the first
// MPI communicator asked for, so a process that never asks (strata.torch under torchrun) needs no MPI installed.
#include <mutex>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/comm/in_process.h"
#include "runtime/comm/job_watch.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/nccl_backend.h"
#include "runtime/comm/shm_communicator.h"
#include "runtime/shard/layout.h"
#if STRATA_WITH_MPI
#include "runtime/comm/mpi_backend.h"
#endif

namespace strata::capi {
namespace {

comm::Options WorldOptions() {
  comm::Options o;
  o.name = "world";  // the engine duplicates it with the configured collective timeout
  return o;
}

#if !STRATA_WITH_MPI
absl::Status MpiUnavailable() {
  return absl::UnimplementedError(
      "this libstrata was built without MPI (STRATA_WITH_MPI=OFF), so it has no MPI communicator: rebuild with "
      "-DSTRATA_WITH_MPI=ON over an MPI installation (e.g. apt-get install libopenmpi-dev) for mpirun jobs, or launch "
      "with torchrun (strata.torch runs over torch.distributed) or use an in-process or foreign communicator");
}
#endif

// Note [Launchers] (runtime/comm/launcher.cc): under torchrun each process is its own one-rank MPI world,
// so an "MPI world" there would train N separate models; refused, naming the ways that work.
#if STRATA_WITH_MPI
absl::Status RefuseTorchrunWorld(int mpi_rank, int mpi_size) {
  STRATA_ASSIGN_OR_RETURN(const comm::Launch launch, comm::DetectLaunch(mpi_rank, mpi_size));
  if (!launch.torchrun || launch.size == 1) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("started by torchrun (WORLD_SIZE=", launch.size,
                   "), where MPI's world is this process alone: launch with "
                   "`mpirun -n ",
                   launch.size,
                   "` (or srun), or pass torchrun's NCCL communicator to strata_comm_create_nccl, or on GPUs use "
                   "strata_comm_create_torchrun"));
}
#endif

absl::Status CreateMpiWorld(strata_comm** out) {
#if STRATA_WITH_MPI
  // See Note [Process-wide MPI runtime]. Leaked on purpose: no destructor may run at process exit.
  static std::mutex* const mu = new std::mutex();
  static std::weak_ptr<comm::MpiRuntime>* const ours = new std::weak_ptr<comm::MpiRuntime>();
  STRATA_ASSIGN_OR_RETURN(const comm::MpiApi* mpi, comm::MpiBackend());
  auto c = std::make_unique<strata_comm>();
  std::lock_guard<std::mutex> lock(*mu);
  c->mpi_runtime = ours->lock();  // Strata initialised MPI and a world communicator still holds it
  if (c->mpi_runtime == nullptr) {
    STRATA_ASSIGN_OR_RETURN(const bool initialized, mpi->is_initialized());
    if (!initialized) {
      STRATA_ASSIGN_OR_RETURN(c->mpi_runtime, mpi->init());
      *ours = c->mpi_runtime;
    }
  }
  if (c->mpi_runtime != nullptr) {
    STRATA_ASSIGN_OR_RETURN(c->comm, mpi->world(*c->mpi_runtime, WorldOptions()));
  } else {  // the host initialised MPI: adopt its MPI_COMM_WORLD
    STRATA_ASSIGN_OR_RETURN(c->comm, mpi->adopt(mpi->world_fortran_handle(), WorldOptions()));
  }
  STRATA_RETURN_IF_ERROR(RefuseTorchrunWorld(c->comm->rank(), c->comm->size()));
  *out = c.release();
  return absl::OkStatus();
#else
  return MpiUnavailable();
#endif
}

// The torchrun world on GPUs, as `strata train` makes it (StartWorlds in runtime/comm/launcher.cc; decision
// 0007): rank 0's NCCL id over torchrun's store (runtime/comm/bootstrap.h), then a nonblocking NCCL
// initialisation on the calling thread's current device, each bounded by the timeout.
absl::Status CreateTorchrunWorld(int64_t timeout_ms, strata_comm** out) {
#if STRATA_WITH_NCCL
  absl::StatusOr<comm::TorchrunEnv> env = comm::TorchrunLaunch();
  if (absl::IsNotFound(env.status())) {
    return absl::FailedPreconditionError(
        "not a torchrun launch (WORLD_SIZE is unset, or mpirun / srun started the process): use "
        "strata_comm_create_mpi_world or strata_comm_create_mpi there");
  }
  STRATA_RETURN_IF_ERROR(env.status());
  comm::WatchTorchrunJobOrWarn(*env);  // Note [Job watch]
  STRATA_ASSIGN_OR_RETURN(const comm::NcclApi* nccl, comm::NcclBackend());
  comm::Options o = WorldOptions();
  if (timeout_ms > 0) o.timeout_ms = timeout_ms;
  auto c = std::make_unique<strata_comm>();
  STRATA_ASSIGN_OR_RETURN(c->comm, nccl->create_from_torchrun(*env, o));
  *out = c.release();
  return absl::OkStatus();
#else
  (void)timeout_ms, (void)out;
  return absl::UnimplementedError(
      "this libstrata was built without NCCL (STRATA_WITH_CUDA=OFF or NCCL not found): a torchrun launch needs "
      "GPUs; use mpirun with strata_comm_create_mpi_world");
#endif
}

}  // namespace
}  // namespace strata::capi

using strata::capi::Call;
using strata::capi::CheckComm;
using strata::capi::NullArgument;

extern "C" {

strata_status strata_comm_create_mpi_world(strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
    return strata::capi::CreateMpiWorld(out);
  });
}

strata_status strata_comm_create_mpi(int32_t mpi_comm_fortran_handle, strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
#if STRATA_WITH_MPI
    STRATA_ASSIGN_OR_RETURN(const strata::comm::MpiApi* mpi, strata::comm::MpiBackend());
    auto c = std::make_unique<strata_comm>();
    STRATA_ASSIGN_OR_RETURN(c->comm, mpi->adopt(mpi_comm_fortran_handle, strata::capi::WorldOptions()));
    *out = c.release();
    return absl::OkStatus();
#else
    return strata::capi::MpiUnavailable();
#endif
  });
}

strata_status strata_comm_create_nccl(void* nccl_comm, strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
#if STRATA_WITH_NCCL
    if (nccl_comm == nullptr) return NullArgument("nccl_comm");
    auto c = std::make_unique<strata_comm>();
    STRATA_ASSIGN_OR_RETURN(const strata::comm::NcclApi* nccl, strata::comm::NcclBackend());
    STRATA_ASSIGN_OR_RETURN(c->comm, nccl->adopt(nccl_comm, strata::capi::WorldOptions()));
    *out = c.release();
    return absl::OkStatus();
#else
    (void)nccl_comm;
    return absl::UnimplementedError(
        "this libstrata was built without NCCL (STRATA_WITH_CUDA=OFF or NCCL not found); use strata_comm_create_mpi "
        "or strata_comm_create_mpi_world");
#endif
  });
}

strata_status strata_comm_create_torchrun(int64_t timeout_ms, strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
    return strata::capi::CreateTorchrunWorld(timeout_ms, out);
  });
}

strata_status strata_comm_watch_torchrun(void) {
  return Call(__func__, []() -> absl::Status {
    absl::StatusOr<strata::comm::TorchrunEnv> env = strata::comm::TorchrunLaunch();
    if (absl::IsNotFound(env.status())) return absl::OkStatus();  // not a torchrun launch: nothing to watch
    STRATA_RETURN_IF_ERROR(env.status());
    // A job's log lines say their rank, as an MPI world's do (mpi_communicator.cc): strata.torch's gloo world
    // never names it to the library otherwise.
    if (env->world_size > 1 && strata::LogRank() < 0) strata::SetLogRank(env->rank);
    return strata::comm::WatchTorchrunJob(*env);
  });
}

strata_status strata_comm_create_in_process(int32_t world_size, strata_comm** out_comms) {
  return Call(__func__, [&]() -> absl::Status {
    if (out_comms == nullptr) return NullArgument("out_comms");
    if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("world_size ", world_size, " < 1"));
    if (world_size > strata::shard::kMaxWorldSize) {
      return absl::InvalidArgumentError(absl::StrCat("world_size ", world_size, " is above the maximum of ",
                                                     strata::shard::kMaxWorldSize));
    }
    std::vector<std::unique_ptr<strata::comm::Communicator>> group =
        strata::comm::CreateInProcessGroup(world_size, strata::capi::WorldOptions());
    for (int32_t r = 0; r < world_size; ++r) {
      out_comms[r] = new strata_comm();
      out_comms[r]->comm = std::move(group[r]);
    }
    return absl::OkStatus();
  });
}

strata_status strata_comm_create_shm(strata_comm* bootstrap, int64_t timeout_ms, strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out != nullptr) *out = nullptr;
    STRATA_RETURN_IF_ERROR(CheckComm(bootstrap));
    if (out == nullptr) return NullArgument("out");
    if (bootstrap->comm->device_buffers()) {
      return absl::InvalidArgumentError(
          "the shared-memory communicator is for host engines: bootstrap it over a "
          "host communicator (MPI, foreign, in-process), not NCCL");
    }
    strata::comm::Options o = strata::capi::WorldOptions();
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    auto c = std::make_unique<strata_comm>();
    STRATA_ASSIGN_OR_RETURN(c->comm, strata::comm::CreateShmCommunicator(*bootstrap->comm, o));
    *out = c.release();
    return absl::OkStatus();
  });
}

strata_status strata_comm_rank(const strata_comm* comm, int32_t* out_rank) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckComm(comm));
    if (out_rank == nullptr) return NullArgument("out_rank");
    *out_rank = comm->comm->rank();
    return absl::OkStatus();
  });
}

strata_status strata_comm_size(const strata_comm* comm, int32_t* out_size) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckComm(comm));
    if (out_size == nullptr) return NullArgument("out_size");
    *out_size = comm->comm->size();
    return absl::OkStatus();
  });
}

strata_status strata_comm_abort(strata_comm* comm, const char* reason) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckComm(comm));
    comm->comm->Abort(absl::AbortedError(reason != nullptr ? reason : "strata_comm_abort"));
    return absl::OkStatus();
  });
}

strata_status strata_comm_destroy(strata_comm* comm) {
  return Call(__func__, [&]() -> absl::Status {
    if (comm == nullptr) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(CheckComm(comm));
    if (comm->live_engines > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          comm->live_engines, " engine(s) created on this communicator are still alive; destroy them first"));
    }
    comm->magic = 0;
    comm->comm.reset();  // before the MPI runtime it may need
    delete comm;
    return absl::OkStatus();
  });
}

}  // extern "C"
