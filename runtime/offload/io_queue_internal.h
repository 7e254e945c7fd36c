// Machinery shared by the IoQueue back-ends (not part of the public interface): batch bookkeeping, the
// one place where a transfer result is judged (Note [Transfer results]), fault injection and counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/offload/io_queue.h"

namespace strata::offload::internal {

// One batch: completes its callback when the last request finished, with the first error.
class BatchState {
 public:
  BatchState(size_t requests, IoDone done) : remaining_(requests), done_(std::move(done)) {}
  // Records one finished request; runs the callback after the last one.
  // `status` is moved along to the callback, so no thread keeps a copy of it (Note [Status hand-off]).
  void FinishOne(absl::Status status);

 private:
  std::atomic<size_t> remaining_;
  std::mutex mu_;
  absl::Status first_error_;
  IoDone done_;
};

// One request in flight and its progress.
struct InFlight {
  IoRequest req;
  uint64_t done_bytes = 0;
  uint32_t retries = 0;
  int injected_errno = 0;  // from IoFaults: fail without touching the kernel
  std::shared_ptr<BatchState> batch;

  char* cursor() const { return static_cast<char*>(req.data) + done_bytes; }
  uint64_t remaining() const { return req.bytes - done_bytes; }
  uint64_t position() const { return req.offset + done_bytes; }
};

enum class Advance { kComplete, kResubmit, kFailed };

// Note [Transfer results]. Judges one syscall / CQE result for `op` (bytes moved, or -errno):
// progress is added; a short transfer is kResubmit for the remainder; EINTR/EAGAIN are kResubmit up
// to kMaxRetries times; 0 bytes on a read is end of file (DataLoss); anything else negative is an
// error naming the call, file, offset and errno, stored in *error.
inline constexpr uint32_t kMaxRetries = 1000;
Advance AdvanceTransfer(InFlight& op, int64_t result, absl::Status* error);

// Counts requests against IoFaults. Thread-safe.
class FaultInjector {
 public:
  void Set(const IoFaults& faults);
  // Called once per submitted request, in submission order: errno to fail it with, or 0.
  int OnSubmit(const IoRequest& req);
  // The most bytes one syscall may move for a transfer of `remaining` bytes.
  uint64_t Clip(uint64_t remaining) const;

 private:
  mutable std::mutex mu_;
  IoFaults faults_;
  uint64_t matched_ = 0;
  std::atomic<uint64_t> max_bytes_{0};
};

struct Counters {
  std::atomic<uint64_t> requests{0}, bytes_read{0}, bytes_written{0}, resubmits{0}, fixed{0}, failed{0};
  IoQueueStats Snapshot() const;
};

// Checks a batch before anything is submitted and builds its in-flight records (fault decisions made
// here, in order). An empty batch, or an invalid one (InvalidArgument naming the bad request), completes
// `done` at once and gives no records.
std::vector<std::unique_ptr<InFlight>> MakeInFlight(absl::Span<const IoRequest> batch, IoDone done,
                                                    FaultInjector& faults, Counters& counters);

// Accounts a completed request in `counters` and finishes it in its batch.
// Note [Status hand-off]. A Status travels from the queue thread to the waiter by moves only: the
// queue thread keeps no copy, so the error's shared payload is freed by the waiter's side (ordered by
// the IoWork's mutex and shared_ptr), never by a queue thread racing with a reader.
void FinishRequest(std::unique_ptr<InFlight> op, absl::Status status, Counters& counters);

// The back-end factories (CreateIoQueue picks one).
absl::StatusOr<std::unique_ptr<IoQueue>> CreateThreadPoolQueue(const IoQueueOptions& options);
absl::StatusOr<std::unique_ptr<IoQueue>> CreateUringQueue(const IoQueueOptions& options);

}  // namespace strata::offload::internal
