// IoQueue: asynchronous positional reads and writes (fd, buffer, bytes, offset) with batched submission
// and checked completion (docs/design.md "NVMe"). Two back-ends behind one interface:
//   - io_uring (uring_queue.cc; built when STRATA_WITH_URING and liburing are found): one ring owned by
//     one ring thread, set up with the fastest flags the kernel accepts, registered buffers used with
//     READ_FIXED / WRITE_FIXED, up to `depth` requests in the kernel at once;
//   - a pread/pwrite thread pool (thread_pool_queue.cc): one worker per queue slot (at most 64), used
//     when io_uring is not built, refused by the kernel or the sandbox, or asked for.
//
// Guarantees (both back-ends). Every request is carried to completion: a short transfer is resubmitted
// for the remainder, EINTR / EAGAIN are retried (bounded), end of file on a read is DataLoss, and any
// other error is a Status naming the call, file, offset, byte count and errno (ENOSPC ->
// ResourceExhausted, EROFS/EACCES -> PermissionDenied, ...: ErrnoError's mapping). A batch completes
// once, after all of its requests finished, with the first error; the other requests of the batch still
// ran (no silent partial cancel). Requests have no ordering among themselves: a caller that needs a
// write to land before a read of the same bytes waits for the write first.
//
// Buffers. `data` must stay valid and untouched until the batch completes. Files opened with O_DIRECT
// need `data`, `bytes` and `offset` aligned to the device's logical block (NvmeStore uses 4096).
//
// Threads. Submit is thread-safe and never blocks on I/O (requests beyond `depth` wait in a software
// queue). Completion callbacks run on a queue thread: they must be short and must not wait for other
// I/O of the same queue (submitting more is fine). The destructor waits for every submitted request.
#pragma once

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/offload/io_work.h"
#include "runtime/memory/memory.h"

namespace strata::offload {

enum class IoOp : uint8_t { kRead, kWrite };
enum class IoBackend { kAuto, kUring, kThreads };

absl::string_view IoBackendName(IoBackend b);  // "auto", "uring", "threads"
absl::StatusOr<IoBackend> ParseIoBackend(absl::string_view text);

struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  const char* file = "";  // shown in errors; must outlive the request
  void* data = nullptr;
  uint64_t bytes = 0;
  uint64_t offset = 0;
};

// Test hooks (fault injection). Counting starts at SetFaults; the default injects nothing.
struct IoFaults {
  // The k-th request submitted after SetFaults (1-based; 0 = none) that matches `fail_only` fails with
  // `fail_errno` without reaching the kernel, exactly as if the syscall had returned it.
  uint64_t fail_request = 0;
  int fail_errno = EIO;
  std::optional<IoOp> fail_only;
  // When > 0 every read/write syscall (or SQE) moves at most this many bytes, so every larger request
  // completes short and its remainder is resubmitted. Keep it a multiple of 4096 on O_DIRECT files.
  uint64_t max_bytes_per_io = 0;
};

struct IoQueueOptions {
  // kAuto: io_uring when built and accepted, else threads; STRATA_IO_BACKEND (uring|threads) overrides
  // kAuto only. kUring fails with Unavailable when io_uring cannot be used (no silent fallback).
  IoBackend backend = IoBackend::kAuto;
  uint32_t depth = 64;  // requests in the kernel at once (ring entries / pread workers)
  // Ask for IORING_SETUP_SQPOLL (dropped when refused). Off by default: the kernel poller spins a core
  // for sqpoll_idle_ms after every burst, one per queue; without it the ring uses DEFER_TASKRUN.
  bool sqpoll = false;
  uint32_t sqpoll_idle_ms = 20;  // how long the kernel SQ thread spins before sleeping
  std::string name = "offload";  // shown in the log line naming the chosen back-end
  // Test hook: io_uring setup flags to treat as refused (EINVAL), to exercise the flag ladder; ~0u also
  // refuses a ring without flags (EPERM, as with the io_uring_disabled sysctl): io_uring is then
  // unavailable, and kAuto falls back to threads.
  uint32_t refuse_uring_flags_for_test = 0;
};

struct IoQueueStats {
  uint64_t requests = 0;    // submitted requests
  uint64_t bytes_read = 0;  // bytes moved by completed transfers
  uint64_t bytes_written = 0;
  uint64_t resubmits = 0;         // short transfers resubmitted for their remainder (plus EINTR/EAGAIN retries)
  uint64_t fixed_buffer_ios = 0;  // SQEs issued as READ_FIXED / WRITE_FIXED
  uint64_t failed_requests = 0;
};

// Runs once per batch, on a queue thread (or on the submitting thread for a rejected or empty batch).
using IoDone = std::function<void(absl::Status)>;

class IoQueue {
 public:
  virtual ~IoQueue() = default;

  virtual IoBackend backend() const = 0;
  // What was set up, for logs and benchmark output: "io_uring depth=64 flags=sqpoll|coop_taskrun".
  virtual std::string description() const = 0;
  virtual uint32_t depth() const = 0;

  // Registers page-locked buffers (normally PinnedPool::buffers()); later requests whose bytes lie
  // inside one of them use READ_FIXED / WRITE_FIXED. A hint: back-ends without registration accept and
  // ignore it. Replaces an earlier registration; call it with no I/O in flight. Blocks. On failure
  // (e.g. ENOMEM: locked-memory limit) the queue stays usable without registered buffers.
  virtual absl::Status RegisterBuffers(absl::Span<const memory::BufferView> buffers) = 0;

  // Submits the batch as one unit (one io_uring_submit for all of it) and returns at once; `done`
  // runs after every request of the batch completed. An invalid request (null data, negative fd)
  // rejects the whole batch before anything is submitted.
  virtual void SubmitWithCallback(absl::Span<const IoRequest> batch, IoDone done) = 0;

  // Test hook: see IoFaults. Thread-safe; applies to requests submitted afterwards.
  virtual void SetFaults(const IoFaults& faults) = 0;
  virtual IoQueueStats stats() const = 0;

  // SubmitWithCallback, completed through an IoWork.
  IoWork Submit(absl::Span<const IoRequest> batch);
};

// Creates the back-end `options` asks for. Logs one info line naming the back-end in use and, when it
// fell back to threads, why ("io_uring refused: io_uring_queue_init_params: Operation not permitted").
absl::StatusOr<std::unique_ptr<IoQueue>> CreateIoQueue(const IoQueueOptions& options);

// True when this build contains the io_uring back-end.
bool UringCompiledIn();

}  // namespace strata::offload
