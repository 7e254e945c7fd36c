// The NCCL back-end for device buffers (docs/design.md "Communication"). Built with STRATA_WITH_CUDA when NCCL
// is found, into the CUDA back-end module (the core reaches it through nccl_backend.h). Collectives are enqueued on the
// CudaStream passed to them; the returned Work's Wait() polls the stream's progress and ncclCommGetAsyncError against
// the communicator's deadline, and on a timeout or an asynchronous error aborts the communicator (ncclCommAbort) and
// fails naming the collective and the rank, so a dead peer never becomes a hang. One communicator per stream: Dup() is
// ncclCommSplit. Every NCCL communicator Strata makes is nonblocking, so initialisation and splits are deadline-bounded
// too (Note [Nonblocking NCCL] in the .cc).
// Bootstrap: rank 0 makes the id (NewNcclId) and hands it to the others, through MPI (a host
// Communicator's Broadcast) or the torchrun-style TCP exchange (bootstrap.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

// A fresh ncclUniqueId as bytes (rank 0 only).
absl::StatusOr<std::string> NewNcclId();

// Collective over `world_size` processes that pass the same id; the caller selects its CUDA device
// beforehand. Blocks until every rank joined; after `options.timeout_ms` it aborts the half-made
// communicator and returns DeadlineExceeded naming the rank and the world size.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const std::string& id, int rank, int world_size,
                                                                     const Options& options);

// Over a communicator the caller created (`nccl_comm` is its ncclComm_t): splits it (collective over its
// ranks; the caller keeps and later destroys its own), so Strata's collectives never interleave with the
// caller's. InvalidArgument for null.
absl::StatusOr<std::unique_ptr<Communicator>> AdoptNcclCommunicator(void* nccl_comm, const Options& options);

// Note [Host buffers over NCCL]: a Communicator for small collectives on host buffers, on any stream,
// carried by an NCCL communicator (owned) through a device bounce buffer on a private CUDA stream. Every
// call blocks until done and returns a completed Work. For the engine's control collectives when the only
// communicator the embedder gave is NCCL.
absl::StatusOr<std::unique_ptr<Communicator>> HostBuffersOverNccl(std::unique_ptr<Communicator> nccl);

// Spreads rank 0's id over a host communicator (MPI launch) and creates the NCCL communicator.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromHost(Communicator& host, device::Stream& host_stream,
                                                                 const Options& options);

// A torchrun-style launch (no MPI): rank 0's id travels over torchrun's store (ExchangeBlob, Note [Bootstrap
// over the store]), then the NCCL communicator of `env.world_size` ranks, on the CUDA device the caller
// selected. A rank without a GPU fails every rank at once, naming it. Each step gives up after
// `options.timeout_ms`.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromTorchrun(const TorchrunEnv& env, const Options& options);

}  // namespace strata::comm
