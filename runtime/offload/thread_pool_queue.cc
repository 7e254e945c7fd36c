// The pread/pwrite thread-pool back-end of IoQueue (io_queue.h): one worker per queue slot, each taking
// the oldest queued request and carrying it to completion with blocking positional syscalls. A short
// transfer is followed at once by another syscall for the remainder (Note [Transfer results]); with
// IoFaults::max_bytes_per_io every syscall is clipped, so that path runs in tests.
//
// Shutdown: the destructor lets the workers drain everything already submitted, then joins them.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/offload/io_queue_internal.h"

namespace strata::offload::internal {
namespace {

constexpr uint32_t kMaxWorkers = 64;
constexpr uint64_t kMaxBytesPerSyscall = uint64_t{1} << 30;  // below Linux's 0x7ffff000 per-call cap

class ThreadPoolQueue final : public IoQueue {
 public:
  explicit ThreadPoolQueue(uint32_t workers) : workers_(workers) {
    for (uint32_t i = 0; i < workers_; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPoolQueue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  IoBackend backend() const override { return IoBackend::kThreads; }
  std::string description() const override { return absl::StrCat("threads depth=", workers_); }
  uint32_t depth() const override { return workers_; }
  absl::Status RegisterBuffers(absl::Span<const memory::BufferView>) override { return absl::OkStatus(); }
  void SetFaults(const IoFaults& faults) override { faults_.Set(faults); }
  IoQueueStats stats() const override { return counters_.Snapshot(); }

  void SubmitWithCallback(absl::Span<const IoRequest> batch, IoDone done) override {
    auto ops = MakeInFlight(batch, std::move(done), faults_, counters_);
    if (ops.empty()) return;  // done already has the verdict
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& op : ops) queue_.push_back(std::move(op));
    }
    if (ops.size() == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  void Run() {
    while (true) {
      std::unique_ptr<InFlight> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status status = Execute(*op);
      FinishRequest(std::move(op), std::move(status), counters_);
    }
  }

  // Blocking syscalls until the request is complete or failed.
  absl::Status Execute(InFlight& op) {
    while (op.remaining() > 0) {
      int64_t result;
      if (op.injected_errno != 0) {
        result = -std::exchange(op.injected_errno, 0);  // injected once, as one failed syscall
      } else {
        const size_t n = std::min<uint64_t>(faults_.Clip(op.remaining()), kMaxBytesPerSyscall);
        const ssize_t r = op.req.op == IoOp::kRead
                              ? ::pread(op.req.fd, op.cursor(), n, static_cast<off_t>(op.position()))
                              : ::pwrite(op.req.fd, op.cursor(), n, static_cast<off_t>(op.position()));
        result = r < 0 ? -errno : r;
      }
      absl::Status error;
      switch (AdvanceTransfer(op, result, &error)) {
        case Advance::kComplete:
          return absl::OkStatus();
        case Advance::kFailed:
          return error;
        case Advance::kResubmit:
          counters_.resubmits.fetch_add(1);
          break;
      }
    }
    return absl::OkStatus();
  }

  const uint32_t workers_;
  FaultInjector faults_;
  Counters counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<InFlight>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started after everything above exists
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> CreateThreadPoolQueue(const IoQueueOptions& options) {
  const uint32_t workers = std::min(std::max(options.depth, 1u), kMaxWorkers);
  return std::unique_ptr<IoQueue>(std::make_unique<ThreadPoolQueue>(workers));
}

}  // namespace strata::offload::internal
