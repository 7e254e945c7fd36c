// The foreign back-end: collectives that a trainer already owns (torch.distributed's process groups, or any
// other), handed to Strata as blocking calls over host buffers. The C ABI's strata_foreign_comm adapts to
// ForeignEndpoint (runtime/capi/capi_foreign.cc); docs/decisions/0033-foreign-communicators.md has the design.
//
// The endpoint moves the data and sums; the communicator on top of it (CreateForeignCommunicator) keeps the
// Communicator contract: each collective runs on its stream's worker in stream order, the endpoint's call is
// made on a thread of the communicator's own and waited for against the deadline (Note [Foreign calls]), a
// timeout names the ranks that did not respond (Note [Stall budget] and Note [Late answers], over the
// endpoint's key-value store), and failure notices travel through the same store (Note [Failure notices]).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

// One rank's handle on the trainer's communicator. Every call blocks until it is done on this rank. The
// collectives are called by every rank in the same order, one at a time per endpoint, from one thread at a
// time; StoreSet and StoreGet may be called from any thread, also while a collective of the endpoint runs.
class ForeignEndpoint {
 public:
  virtual ~ForeignEndpoint() = default;  // frees the trainer's side (the C ABI's destroy callback)
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Layouts as Communicator's. The reductions are sums (the communicator scales an average itself).
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual absl::Status Broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // A new endpoint over the same ranks, whose collectives give up after `timeout_ms`.
  virtual absl::StatusOr<std::unique_ptr<ForeignEndpoint>> Dup(int64_t timeout_ms) = 0;
  // A new endpoint over the ranks whose color is this rank's, ranked by (key, rank here). `colors` and
  // `keys` hold every rank's, indexed by rank here (every color >= 0).
  virtual absl::StatusOr<std::unique_ptr<ForeignEndpoint>> Split(const std::vector<int>& colors,
                                                                 const std::vector<int>& keys, int64_t timeout_ms) = 0;
  // The job's key-value store (torch.distributed's Store), shared by every rank: optional. Without it the
  // ranks that miss a deadline are not named, and failure notices are not sent.
  virtual bool has_store() const { return false; }
  virtual absl::Status StoreSet(const std::string& key, const std::string& value);
  // The value of `key`, nullopt while it is unset; does not wait for it.
  virtual absl::StatusOr<std::optional<std::string>> StoreGet(const std::string& key);
  // Ends the whole job from this rank (the trainer's way: torchrun's agent stops the others when a process
  // exits). May not return; returns at once when the trainer gave no way.
  virtual void AbortJob(const std::string& reason) { static_cast<void>(reason); }
};

// Collective over `endpoint`'s ranks (its rank and size are the world of everything split from it): rank 0's
// random job id reaches every rank in a broadcast, then every rank's number in an all-gather that checks the
// ranks, both bounded by options.timeout_ms. On success the communicator owns the endpoint; on failure the
// endpoint is destroyed, unless its call is still running (Note [Foreign calls]).
absl::StatusOr<std::unique_ptr<Communicator>> CreateForeignCommunicator(std::unique_ptr<ForeignEndpoint> endpoint,
                                                                        const Options& options);

}  // namespace strata::comm
