// Communicator and Work: collectives over flat buffers (DESIGN "Communication").
//
// Protocol. Every rank issues the same collectives in the same order on corresponding communicators.
// A collective is enqueued on the stream passed to it and runs in that stream's order; the call returns
// at once with a Work. Buffers must stay valid and untouched until the Work completes. A communicator
// is used from one stream at a time: a second stream that issues collectives gets its own Dup().
//
// Failure. Each collective has a deadline (Options::timeout_ms). A collective whose peers do not all
// arrive in time fails with DeadlineExceeded naming the ranks that did not respond; a mismatched
// collective (other op or count on some rank) fails with InvalidArgument naming the rank. The failure
// is sticky on the stream (device.h), so nothing after it runs and nobody waits forever.
//
// Layouts. AllGather: send holds `count` elements, recv holds size()*count, rank r's block at r*count;
// in place when send == recv + rank()*count. ReduceScatter: send holds size()*count, recv gets this
// rank's reduced block of `count` (recv must not overlap send). AllReduce: count elements, in place when send == recv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/base/dtype.h"
#include "runtime/device/device.h"

namespace strata::comm {

enum class ReduceOp { kSum, kAvg };

// A handle on one enqueued collective. Copyable; all copies observe the same completion.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<device::Event> done) : done_(std::move(done)) {}
  // Blocks the calling thread until the collective finished; returns its status (sticky stream status).
  absl::Status Wait() const { return done_ ? done_->Synchronize() : absl::OkStatus(); }
  // Later work on `stream` waits for this collective; no host blocking.
  void StreamWait(device::Stream& stream) const {
    if (done_) stream.WaitFor(*done_);
  }
  bool Done() const { return !done_ || done_->Query(); }

 private:
  std::shared_ptr<device::Event> done_;
};

struct Options {
  int64_t timeout_ms = 60000;
  std::string name = "world";  // shown in errors: "all_gather #12 on 'gather'"
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const Options& options() const = 0;
  // True when collectives take device buffers on CUDA streams (NCCL); false for host buffers.
  virtual bool device_buffers() const { return false; }

  virtual Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& stream) = 0;
  virtual Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                             device::Stream& stream) = 0;
  virtual Work AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         device::Stream& stream) = 0;
  virtual Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& stream) = 0;
  virtual Work Barrier(device::Stream& stream) = 0;

  // A communicator over the same ranks with its own ordering, for another stream. Collective: every
  // rank calls it, in the same order, from the issuing thread, with no collective of this communicator
  // still queued (Dup runs on the calling thread, not in stream order). Blocks. `timeout_ms` > 0
  // replaces the inherited timeout.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms = 0) = 0;

  // Ends the whole job from this rank after an unrecoverable error (MPI_Abort / ncclCommAbort); for the
  // in-process backend, fails every later collective of the group. Does not return for MPI.
  virtual void Abort(const absl::Status& cause) = 0;
};

// Raw bytes through a collective (records, fingerprints, ids, text): the one place they are given an
// element type. They travel as 16-bit elements, which every back-end moves without arithmetic; `bytes`
// must be even (a caller's layout bug otherwise, checked).
Work AllGatherBytes(Communicator& comm, const void* send, void* recv, size_t bytes, device::Stream& stream);
Work BroadcastBytes(Communicator& comm, void* buf, size_t bytes, int root, device::Stream& stream);

}  // namespace strata::comm
