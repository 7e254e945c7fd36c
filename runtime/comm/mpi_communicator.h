// The MPI back-end for host buffers, and the MPI bootstrap (mpirun / srun).
//
// MpiRuntime initialises MPI with MPI_THREAD_MULTIPLE (each stream's worker issues collectives on its
// own duplicated communicator) and finalises it. Collectives are MPI's non-blocking ones, polled
// against the deadline; on a timeout the rank runs a one-time liveness exchange on a private control
// communicator so the error can name the ranks that did not respond (dead, stopped or stuck).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

struct MpiContext;  // shared by all communicators of the process (custom ops, control communicator)

class MpiRuntime {
 public:
  // Initialises MPI (once per process); FailedPrecondition when MPI_THREAD_MULTIPLE is not provided.
  static absl::StatusOr<std::unique_ptr<MpiRuntime>> Init(int* argc, char*** argv);
  ~MpiRuntime();  // MPI_Finalize (unless the job was aborted)
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const;
  int world_size() const;
  // A new communicator over MPI_COMM_WORLD (duplicated, so it has its own ordering).
  absl::StatusOr<std::unique_ptr<Communicator>> World(const Options& options);

 private:
  explicit MpiRuntime(std::shared_ptr<MpiContext> ctx) : ctx_(std::move(ctx)) {}
  std::shared_ptr<MpiContext> ctx_;
};

}  // namespace strata::comm
