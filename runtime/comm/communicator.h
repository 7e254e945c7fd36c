// Communicator and Work: collectives over flat buffers (docs/design.md "Communication").
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
//
// Note [Traffic]. Each communicator counts what its collectives move, per kind, when they are issued (a
// collective that later fails is counted too): the payload, i.e. the bytes of the larger of its buffers
// on this rank, whatever algorithm the back-end picks. AllGather and ReduceScatter: size() * count
// elements (the gathered buffer, the buffer reduced); AllReduce and Broadcast: count; Barrier: 0. A ring
// sends (size-1)/size of an all-gather's or reduce-scatter's payload and 2(size-1)/size of an all-reduce's
// per rank; the payload is what a formula over the engine's layout predicts exactly, so tests and stats
// compare it.
#pragma once

#include <array>
#include <atomic>
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

enum class Collective { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
inline constexpr int kNumCollectives = 5;
const char* CollectiveName(Collective c);  // "all_gather", ...

// Note [Traffic]: what one communicator issued so far.
struct Traffic {
  std::array<uint64_t, kNumCollectives> calls{};
  std::array<uint64_t, kNumCollectives> bytes{};
  uint64_t calls_of(Collective c) const { return calls[static_cast<int>(c)]; }
  uint64_t bytes_of(Collective c) const { return bytes[static_cast<int>(c)]; }
  uint64_t total_bytes() const;
  Traffic operator-(const Traffic& earlier) const;  // what was issued since `earlier`
};

// The counter behind Communicator::traffic(); thread-safe (relaxed atomics: a reader sees every
// collective issued before it on the same thread, and possibly some issued concurrently).
class TrafficCounter {
 public:
  void Add(Collective c, uint64_t bytes);
  Traffic Read() const;

 private:
  std::array<std::atomic<uint64_t>, kNumCollectives> calls_{};
  std::array<std::atomic<uint64_t>, kNumCollectives> bytes_{};
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

  // Splits this communicator's ranks into disjoint communicators (MPI_Comm_split, ncclCommSplit): the
  // ranks that pass the same `color` (>= 0) form one, ranked by (`key`, rank here). Collective with
  // Dup's rules (every rank, same order, issuing thread, nothing of this communicator queued); blocks.
  // The split itself is bounded by this communicator's timeout: a rank that does not arrive is
  // DeadlineExceeded (the in-process and MPI back-ends name it). The result has `name` and, when
  // `timeout_ms` > 0, that timeout, else this one's. A negative color is InvalidArgument (on every rank
  // for the host back-ends, which exchange the colors first; NCCL refuses it locally and its peers time out).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                              int64_t timeout_ms = 0) = 0;

  // Note [Traffic]: what this communicator's collectives moved so far (not those of its Dups or Splits).
  virtual Traffic traffic() const = 0;

  // Ends the whole job from this rank after an unrecoverable error (MPI_Abort / ncclCommAbort); for the
  // in-process backend, fails every later collective of the group. Does not return for MPI.
  virtual void Abort(const absl::Status& cause) = 0;

  // Note [Failure notices]. Tells this communicator's peers that this rank failed with `cause` and will
  // not issue the collectives they may be waiting for: their waits on this communicator for a collective
  // this rank does not join, the one in flight and every later one, end within milliseconds with an
  // AbortedError that names this rank and carries `cause` (and IsPeerFailure), instead of at their
  // deadline. A collective this rank did join still completes (MPI polls a noticed one for 200 ms more). Unlike Abort
  // it returns and ends no process, and it is scoped to this communicator (not its Dups or Splits), so an engine
  // notifies each communicator it owns and the job's other engines are untouched. Only the first call sends; any thread
  // may call it. The host back-ends implement it (MPI: a message on a reserved tag that every wait polls for); the
  // default sends nothing, and the peers learn at their deadline.
  virtual void NotifyFailure(const absl::Status& cause) { static_cast<void>(cause); }
};

// The payload that marks a status made from a peer's notice (Note [Failure notices]), so that a rank which
// fails because a peer did passes the notice on to no one.
inline constexpr char kPeerFailurePayload[] = "strata.comm/peer_failure";
bool IsPeerFailure(const absl::Status& s);
// The status a wait returns when `sender` (a rank of the world) sent `cause_message`; `what` is the
// collective, as in the back-end's other errors.
absl::Status PeerFailure(const std::string& what, int sender, const std::string& cause_message);

// Raw bytes through a collective (records, fingerprints, ids, text): the one place they are given an
// element type. They travel as 16-bit elements, which every back-end moves without arithmetic; `bytes`
// must be even (a caller's layout bug otherwise, checked).
// The payload of one collective (Note [Traffic]) on a communicator of `size` ranks.
uint64_t PayloadBytes(Collective c, size_t count, DType dtype, int size);

Work AllGatherBytes(Communicator& comm, const void* send, void* recv, size_t bytes, device::Stream& stream);
Work BroadcastBytes(Communicator& comm, void* buf, size_t bytes, int root, device::Stream& stream);

}  // namespace strata::comm
