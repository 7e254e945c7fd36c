// The MPI back-end for host buffers, and the MPI bootstrap (mpirun / srun).
//
// MpiRuntime initialises MPI with MPI_THREAD_MULTIPLE (each stream's worker issues collectives on its
// own duplicated communicator) and finalises it. Collectives are MPI's non-blocking ones, polled
// against the deadline; on a timeout the rank runs a one-time liveness exchange on a private control
// communicator so the error can name the ranks that did not respond (dead, stopped or stuck).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

struct MpiContext;  // shared by all communicators of the process (custom ops, control communicator)

class MpiRuntime {
 public:
  // Initialises MPI (once per process); FailedPrecondition when MPI_THREAD_MULTIPLE is not provided.
  static absl::StatusOr<std::unique_ptr<MpiRuntime>> Init(int* argc, char*** argv);
  // Uses an MPI the caller initialised (with MPI_THREAD_MULTIPLE, else FailedPrecondition); never
  // finalises it. For trainers that embed Strata and own MPI themselves.
  static absl::StatusOr<std::unique_ptr<MpiRuntime>> Adopt();
  // true when MPI is initialised (and not finalised); FailedPrecondition once finalised.
  static absl::StatusOr<bool> IsInitialized();
  static int WorldFortranHandle();  // MPI_Comm_c2f(MPI_COMM_WORLD)
  ~MpiRuntime();  // MPI_Finalize when this runtime initialised MPI
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const;
  int world_size() const;
  // Ends the whole job from this rank (MPI_Abort on MPI_COMM_WORLD) after logging `reason`: for a failure
  // before any communicator exists, where a peer may already wait in MPI's communicator creation, which
  // has no deadline. Does not return.
  [[noreturn]] void AbortJob(const std::string& reason);
  // Note [Start-up agreement]: every rank's start-up error ("" for a rank that started), in world-rank
  // order, gathered on the runtime's private duplicate of MPI_COMM_WORLD before any communicator is made
  // (MPI_Comm_dup has no deadline). DeadlineExceeded when not every rank arrived within `timeout_ms`: the
  // exchange is then still pending and the caller must end the job (AbortJob).
  absl::StatusOr<std::vector<std::string>> GatherStartErrors(const std::string& mine, int64_t timeout_ms);
  // A new communicator over MPI_COMM_WORLD (duplicated, so it has its own ordering).
  absl::StatusOr<std::unique_ptr<Communicator>> World(const Options& options);
  // A new communicator over a duplicate of any MPI communicator, given by its Fortran handle
  // (MPI_Comm_c2f) so that this header needs no mpi.h. Collective over that communicator. A timeout's
  // liveness check names unresponsive peers by their MPI_COMM_WORLD rank.
  absl::StatusOr<std::unique_ptr<Communicator>> Wrap(int fortran_handle, const Options& options);

 private:
  MpiRuntime(std::shared_ptr<MpiContext> ctx, bool owns_mpi) : ctx_(std::move(ctx)), owns_mpi_(owns_mpi) {}
  static absl::StatusOr<std::shared_ptr<MpiContext>> MakeContext();
  std::shared_ptr<MpiContext> ctx_;
  bool owns_mpi_;
};

}  // namespace strata::comm
