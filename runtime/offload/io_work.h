// IoWork: the waitable handle of an asynchronous offload I/O (CONVENTIONS 4), and IoPromise, its
// producer side.
//
// Why not comm::Work: a comm::Work wraps a device::Event, and a host event can only be completed by a
// stream that recorded it; I/O completes on a queue thread (an io_uring reaper or a pread worker) that is
// not a stream. IoWork has the same surface (Wait, Done, StreamWait), so engine code treats both alike.
//
// Guarantees. An IoWork completes exactly once, with OK or the first error of the operation it covers.
// Every copy observes the same completion. Everything the operation does (including the checksum check
// of a store read) has happened before Wait() returns or Done() turns true. A default-constructed IoWork
// is complete and OK. An IoPromise destroyed without Complete() completes its work with an Internal
// error, so a lost completion is a failure, never a hang.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/device/device.h"

namespace strata::offload {

namespace internal {
struct IoWorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  int64_t completed_ns = 0;
};
}  // namespace internal

class IoWork {
 public:
  IoWork() = default;
  // An already-completed work carrying `status` (used for requests rejected before any I/O).
  static IoWork Completed(absl::Status status);

  // Blocks the calling thread until the operation finished; returns its status. Thread-safe, any
  // number of waiters, may be called repeatedly.
  absl::Status Wait() const;
  // Non-blocking: true once the operation finished (successfully or not).
  bool Done() const;
  // Later work on `stream` starts only after this operation finished, and fails with its error.
  // Host streams: enqueues a task that blocks the stream's worker (what HostStream::WaitFor does
  // too). CUDA streams: the same task runs as a host function; the engine should prefer waiting
  // on the host before enqueuing the device copy from a pinned buffer. Does not block the caller.
  void StreamWait(device::Stream& stream) const;
  // Monotonic time (device::NowNs) at which it completed; 0 while pending. For I/O timelines.
  int64_t completed_ns() const;

 private:
  friend class IoPromise;
  explicit IoWork(std::shared_ptr<internal::IoWorkState> s) : state_(std::move(s)) {}
  std::shared_ptr<internal::IoWorkState> state_;
};

// Completes one IoWork. Move-only; Complete() may be called from any thread, once.
class IoPromise {
 public:
  IoPromise();
  ~IoPromise();
  IoPromise(IoPromise&&) noexcept = default;
  IoPromise& operator=(IoPromise&&) noexcept;
  IoPromise(const IoPromise&) = delete;
  IoPromise& operator=(const IoPromise&) = delete;

  IoWork work() const { return IoWork(state_); }
  void Complete(absl::Status status);

 private:
  std::shared_ptr<internal::IoWorkState> state_;
};

// Waits for every work (even after a failure, so no buffer is still in use on return) and returns
// the first error in span order.
absl::Status WaitAll(absl::Span<const IoWork> works);

}  // namespace strata::offload
