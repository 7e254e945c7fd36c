// The NCCL back-end for device buffers (DESIGN "Communication"). Built with STRATA_WITH_CUDA when NCCL
// is found. Collectives are enqueued on the CudaStream passed to them; the returned Work's Wait() polls
// the stream's progress and ncclCommGetAsyncError against the communicator's deadline, and on a timeout
// or an asynchronous error aborts the communicator (ncclCommAbort) and fails naming the collective and
// the rank, so a dead peer never becomes a hang. One communicator per stream: Dup() is ncclCommSplit.
// Bootstrap: rank 0 makes the id (NewNcclId) and hands it to the others, through MPI (a host
// Communicator's Broadcast) or the torchrun-style TCP exchange (bootstrap.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

// A fresh ncclUniqueId as bytes (rank 0 only).
absl::StatusOr<std::string> NewNcclId();

// Collective over `world_size` processes that pass the same id; selects the calling thread's CUDA device
// beforehand. Blocks until every rank joined or `options.timeout_ms` passed.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const std::string& id, int rank, int world_size,
                                                                     const Options& options);

// Spreads rank 0's id over a host communicator (MPI launch) and creates the NCCL communicator.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromHost(Communicator& host, device::Stream& host_stream,
                                                                 const Options& options);

}  // namespace strata::comm
