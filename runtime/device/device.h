// Device, Stream and Event: the ordering vocabulary of the engine (docs/design.md "Streams everywhere").
//
// A Stream runs work in the order it was enqueued. An Event marks a point in a stream; another stream
// or the host can wait for it. The host implementation (host_device.h) runs each stream on its own
// worker thread, so overlap between streams is real; the CUDA implementation maps one to one onto
// cudaStream_t / cudaEvent_t.
//
// Errors are sticky per stream, like CUDA's: once a task on a stream fails, later tasks on it are
// skipped, events recorded on it still complete (so nobody hangs) but carry the error, and a stream
// that waits on a failed event fails too. Synchronize() returns the first error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::device {

enum class DeviceKind { kHost, kCuda };

// Work enqueued on a stream. Runs on the stream's worker (host) or a driver thread (CUDA host fn).
using HostTask = std::function<absl::Status()>;

class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until the last Record() of this event completed; returns the status the
  // recording stream had at that point. An event never recorded is complete. Thread-safe.
  virtual absl::Status Synchronize() = 0;
  // Non-blocking: true when the last recorded point has completed, or failed (Synchronize says how).
  virtual bool Query() = 0;
  // Monotonic time (ns) at which the last recorded point completed; 0 before. Used by timelines.
  virtual int64_t completed_ns() const = 0;
  // What a stream's WaitFor waits on: this event, or the event a wrapper holds (an NCCL collective's
  // completion wraps the CUDA event recorded after it).
  virtual Event& waitable() { return *this; }
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual absl::string_view name() const = 0;
  // Enqueues `task`; returns at once. Not thread-safe against itself: one issuing thread per stream.
  virtual void Enqueue(HostTask task) = 0;
  // Marks the current end of this stream in `event` (re-recording replaces the old point).
  virtual void Record(Event& event) = 0;
  // Later work on this stream starts only after `event`'s recorded point (captured now) completes.
  virtual void WaitFor(Event& event) = 0;
  // Blocks until everything enqueued so far has run; returns the sticky status.
  virtual absl::Status Synchronize() = 0;
  // Non-blocking: the sticky status as of now (the first failure among the work that has run so far).
  virtual absl::Status status() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) = 0;
  virtual std::unique_ptr<Event> CreateEvent() = 0;
};

// Monotonic clock in ns, shared by events and timelines.
int64_t NowNs();

}  // namespace strata::device
