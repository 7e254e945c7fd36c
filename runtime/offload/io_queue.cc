#include "runtime/offload/io_queue.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/offload/io_queue_internal.h"
#include "runtime/base/env.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace strata::offload {

absl::string_view IoBackendName(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "uring";
    case IoBackend::kThreads:
      return "threads";
  }
  return "?";
}

absl::StatusOr<IoBackend> ParseIoBackend(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "auto" || t.empty()) return IoBackend::kAuto;
  if (t == "uring" || t == "io_uring") return IoBackend::kUring;
  if (t == "threads" || t == "thread" || t == "psync") return IoBackend::kThreads;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown I/O back-end '", text, "' (expected auto, uring or threads)"));
}

IoWork IoQueue::Submit(absl::Span<const IoRequest> batch) {
  auto promise = std::make_shared<IoPromise>();
  IoWork work = promise->work();
  SubmitWithCallback(batch, [promise](absl::Status s) { promise->Complete(std::move(s)); });
  return work;
}

absl::StatusOr<std::unique_ptr<IoQueue>> CreateIoQueue(const IoQueueOptions& options) {
  if (options.depth == 0) return absl::InvalidArgumentError("I/O queue depth must be at least 1");
  IoBackend want = options.backend;
  std::string why_threads = "asked for";
  if (want == IoBackend::kAuto) {
    const std::string forced = env::ForcedIoBackend();
    if (!forced.empty()) {
      auto parsed = ParseIoBackend(forced);
      if (!parsed.ok()) return Annotate(parsed.status(), "STRATA_IO_BACKEND");
      want = *parsed;
      why_threads = "STRATA_IO_BACKEND=threads";
    }
  }
  if (want != IoBackend::kThreads) {
    auto uring = internal::CreateUringQueue(options);
    if (uring.ok()) {
      STRATA_LOG(Info) << "I/O queue '" << options.name << "': " << (*uring)->description();
      return uring;
    }
    if (want == IoBackend::kUring) return uring.status();
    why_threads = absl::StrCat("io_uring unavailable: ", uring.status().message());
  }
  auto threads = internal::CreateThreadPoolQueue(options);
  if (threads.ok()) {
    STRATA_LOG(Info) << "I/O queue '" << options.name << "': " << (*threads)->description()
                     << " (pread/pwrite fallback: " << why_threads << ")";
  }
  return threads;
}

namespace internal {

void BatchState::FinishOne(absl::Status status) {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_error_.ok()) first_error_ = std::move(status);
  }
  if (remaining_.fetch_sub(1) != 1) return;
  absl::Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    result = std::move(first_error_);
  }
  IoDone done = std::move(done_);
  done(std::move(result));
}

Advance AdvanceTransfer(InFlight& op, int64_t result, absl::Status* error) {
  const bool read = op.req.op == IoOp::kRead;
  if (result < 0) {
    const int err = static_cast<int>(-result);
    if ((err == EINTR || err == EAGAIN) && ++op.retries <= kMaxRetries) return Advance::kResubmit;
    *error = ErrnoError(absl::StrCat(read ? "pread" : "pwrite", " of ", op.remaining(), " bytes at offset ",
                                     op.position(), " of '", op.req.file, "'"),
                        err, __FILE__, __LINE__);
    return Advance::kFailed;
  }
  if (result == 0 && op.remaining() > 0) {
    *error = read ? absl::DataLossError(absl::StrCat("unexpected end of file '", op.req.file, "' at offset ",
                                                     op.position(), ": read of ", op.req.bytes, " bytes at offset ",
                                                     op.req.offset, " got only ", op.done_bytes))
                  : absl::InternalError(absl::StrCat("pwrite of ", op.remaining(), " bytes at offset ", op.position(),
                                                     " of '", op.req.file, "' wrote nothing"));
    return Advance::kFailed;
  }
  op.done_bytes += static_cast<uint64_t>(result);
  return op.done_bytes < op.req.bytes ? Advance::kResubmit : Advance::kComplete;
}

void FaultInjector::Set(const IoFaults& faults) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = faults;
  matched_ = 0;
  max_bytes_.store(faults.max_bytes_per_io);
}

int FaultInjector::OnSubmit(const IoRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  if (faults_.fail_request == 0) return 0;
  if (faults_.fail_only && *faults_.fail_only != req.op) return 0;
  return ++matched_ == faults_.fail_request ? faults_.fail_errno : 0;
}

uint64_t FaultInjector::Clip(uint64_t remaining) const {
  const uint64_t cap = max_bytes_.load(std::memory_order_relaxed);
  return cap > 0 && remaining > cap ? cap : remaining;
}

IoQueueStats Counters::Snapshot() const {
  return IoQueueStats{requests.load(),  bytes_read.load(), bytes_written.load(),
                      resubmits.load(), fixed.load(),      failed.load()};
}

namespace {
absl::Status ValidateBatch(absl::Span<const IoRequest> batch) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const IoRequest& r = batch[i];
    if (r.fd < 0 || (r.bytes > 0 && r.data == nullptr) || r.file == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("I/O request ", i, " of the batch (", r.bytes, " bytes at offset ",
                                                     r.offset, " of '", r.file ? r.file : "?", "') has fd ", r.fd,
                                                     r.data == nullptr ? " and no buffer" : ""));
    }
  }
  return absl::OkStatus();
}
}  // namespace

std::vector<std::unique_ptr<InFlight>> MakeInFlight(absl::Span<const IoRequest> batch, IoDone done,
                                                    FaultInjector& faults, Counters& counters) {
  absl::Status valid = ValidateBatch(batch);
  if (!valid.ok() || batch.empty()) {
    done(std::move(valid));
    return {};
  }
  auto state = std::make_shared<BatchState>(batch.size(), std::move(done));
  std::vector<std::unique_ptr<InFlight>> ops;
  ops.reserve(batch.size());
  for (const IoRequest& r : batch) {
    auto op = std::make_unique<InFlight>();
    op->req = r;
    op->batch = state;
    op->injected_errno = faults.OnSubmit(r);
    ops.push_back(std::move(op));
  }
  counters.requests.fetch_add(batch.size());
  return ops;
}

void FinishRequest(std::unique_ptr<InFlight> op, absl::Status status, Counters& counters) {
  (op->req.op == IoOp::kRead ? counters.bytes_read : counters.bytes_written).fetch_add(op->done_bytes);
  if (!status.ok()) counters.failed.fetch_add(1);
  std::shared_ptr<BatchState> batch = std::move(op->batch);
  op.reset();
  batch->FinishOne(std::move(status));
}

}  // namespace internal
}  // namespace strata::offload
