// The io_uring back-end of IoQueue (io_queue.h).
//
// Protocol. One ring thread owns the ring: it creates it (so IORING_SETUP_SINGLE_ISSUER holds), fills
// SQEs, submits, waits and reaps. Submitters only append to `incoming_` under a mutex and write an
// eventfd; the ring keeps one read of that eventfd armed, so a new batch wakes a ring thread blocked in
// io_uring_submit_and_wait. At most `depth` requests are in the kernel (one slot each, the slot index is
// the CQE's user_data); the rest wait in `ready_`. A short CQE puts the request back at the front of
// `ready_` for its remainder (Note [Transfer results]). Buffer registration runs on the ring thread too.
//
// Setup flags (Note [Ring flags]). We ask for SINGLE_ISSUER plus either SQPOLL (options.sqpoll: a kernel
// thread polls the SQ, no syscall per submit) or COOP_TASKRUN | DEFER_TASKRUN (completions are processed
// only when the ring thread waits: no interrupts), and drop one flag at a time, SQPOLL first, while the
// kernel answers EINVAL or EPERM; when even no flags are refused, io_uring is unavailable and
// CreateIoQueue falls back to the thread pool.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/offload/io_queue_internal.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace strata::offload::internal {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr uint64_t kMaxBytesPerSqe = uint64_t{1} << 30;

struct FlagName {
  unsigned flag;
  const char* name;
};
// In the order they are dropped when refused.
constexpr FlagName kFlags[] = {{IORING_SETUP_SQPOLL, "sqpoll"},
                               {IORING_SETUP_DEFER_TASKRUN, "defer_taskrun"},
                               {IORING_SETUP_SINGLE_ISSUER, "single_issuer"},
                               {IORING_SETUP_COOP_TASKRUN, "coop_taskrun"}};

std::string FlagNames(unsigned flags) {
  std::vector<std::string> names;
  for (const FlagName& f : kFlags) {
    if (flags & f.flag) names.push_back(f.name);
  }
  return names.empty() ? "none" : absl::StrJoin(names, "|");
}

struct Registered {
  const char* begin;
  const char* end;
  int index;
};

class UringQueue final : public IoQueue {
 public:
  explicit UringQueue(const IoQueueOptions& options) : options_(options) {}
  ~UringQueue() override;

  // Starts the ring thread and waits for its setup result.
  absl::Status Start();

  IoBackend backend() const override { return IoBackend::kUring; }
  std::string description() const override { return description_; }
  uint32_t depth() const override { return options_.depth; }
  absl::Status RegisterBuffers(absl::Span<const memory::BufferView> buffers) override;
  void SubmitWithCallback(absl::Span<const IoRequest> batch, IoDone done) override;
  void SetFaults(const IoFaults& faults) override { faults_.Set(faults); }
  IoQueueStats stats() const override { return counters_.Snapshot(); }

 private:
  struct Command {
    std::vector<memory::BufferView> buffers;
    std::promise<absl::Status> result;
  };

  absl::Status SetUpRing();                                     // ring thread
  void Loop();                                                  // ring thread
  bool TakeIncoming();                                          // ring thread; false once stopping and drained
  void FillSq();                                                // ring thread
  void Reap();                                                  // ring thread
  void Complete(std::unique_ptr<InFlight> op, int64_t result);  // ring thread
  absl::Status DoRegister(const std::vector<memory::BufferView>& buffers);  // ring thread
  int FindRegistered(const char* p, uint64_t n) const;
  void Wake();

  const IoQueueOptions options_;
  std::string description_;
  FaultInjector faults_;
  Counters counters_;
  int wake_fd_ = -1;

  std::mutex mu_;  // guards the three members below
  std::deque<std::unique_ptr<InFlight>> incoming_;
  std::deque<Command*> commands_;
  bool stop_ = false;

  // Ring thread only.
  io_uring ring_{};
  std::vector<std::unique_ptr<InFlight>> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<std::unique_ptr<InFlight>> ready_;
  std::vector<Registered> registered_;  // sorted by begin
  uint64_t wake_buf_ = 0;
  bool wake_armed_ = false;
  std::promise<absl::Status> setup_;  // the ring thread's setup result
  std::thread thread_;
};

UringQueue::~UringQueue() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  io_uring_queue_exit(&ring_);
  close(wake_fd_);
}

absl::Status UringQueue::Start() {
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return ErrnoError("eventfd", errno, __FILE__, __LINE__);
  std::future<absl::Status> result = setup_.get_future();
  thread_ = std::thread([this] {
    absl::Status s = SetUpRing();
    const bool ok = s.ok();
    setup_.set_value(std::move(s));
    if (ok) Loop();
  });
  absl::Status s = result.get();
  if (!s.ok()) {
    thread_.join();
    close(wake_fd_);
  }
  return s;
}

// Note [Ring flags]: see the file comment.
absl::Status UringQueue::SetUpRing() {
  // The task-run flags are about interrupting the submitter, which SQPOLL does not do: the kernel
  // rejects them together, so each mode asks for its own set.
  unsigned want = IORING_SETUP_SINGLE_ISSUER;
  want |= options_.sqpoll ? IORING_SETUP_SQPOLL : IORING_SETUP_COOP_TASKRUN | IORING_SETUP_DEFER_TASKRUN;
  std::vector<std::string> refused;
  const unsigned entries = options_.depth + 1;  // + the armed eventfd read
  for (size_t drop = 0;; ++drop) {
    io_uring_params p{};
    p.flags = want;
    if (want & IORING_SETUP_SQPOLL) p.sq_thread_idle = options_.sqpoll_idle_ms;
    const uint32_t refuse = options_.refuse_uring_flags_for_test;
    const int r = (want & refuse) != 0           ? -EINVAL
                  : (want == 0 && refuse == ~0u) ? -EPERM
                                                 : io_uring_queue_init_params(entries, &ring_, &p);
    if (r == 0) break;
    if ((r != -EINVAL && r != -EPERM) || want == 0) {
      return ErrnoError(absl::StrCat("io_uring_queue_init_params(", entries, ", flags=", FlagNames(want), ")"), -r,
                        __FILE__, __LINE__);
    }
    while (drop < std::size(kFlags) && !(want & kFlags[drop].flag)) ++drop;
    const unsigned flag = drop < std::size(kFlags) ? kFlags[drop].flag : want;
    refused.push_back(absl::StrCat(FlagNames(flag), " (", r == -EINVAL ? "EINVAL" : "EPERM", ")"));
    want &= ~flag;
  }
  slots_.resize(options_.depth);
  for (uint32_t i = options_.depth; i > 0; --i) free_slots_.push_back(i - 1);
  description_ = absl::StrCat("io_uring depth=", options_.depth, " flags=", FlagNames(want));
  if (!refused.empty()) absl::StrAppend(&description_, " (refused: ", absl::StrJoin(refused, ", "), ")");
  return absl::OkStatus();
}

void UringQueue::Wake() {
  const uint64_t one = 1;
  while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

absl::Status UringQueue::RegisterBuffers(absl::Span<const memory::BufferView> buffers) {
  Command cmd;
  cmd.buffers.assign(buffers.begin(), buffers.end());
  std::future<absl::Status> result = cmd.result.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(&cmd);
  }
  Wake();
  return result.get();
}

absl::Status UringQueue::DoRegister(const std::vector<memory::BufferView>& buffers) {
  if (!registered_.empty()) {
    io_uring_unregister_buffers(&ring_);
    registered_.clear();
  }
  if (buffers.empty()) return absl::OkStatus();
  std::vector<iovec> iov;
  for (const memory::BufferView& b : buffers) iov.push_back(iovec{b.data, b.bytes});
  const int r = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
  if (r < 0) {
    return ErrnoError(absl::StrCat("io_uring_register_buffers(", iov.size(), " buffers)"), -r, __FILE__, __LINE__);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const char* b = static_cast<const char*>(buffers[i].data);
    registered_.push_back(Registered{b, b + buffers[i].bytes, static_cast<int>(i)});
  }
  std::sort(registered_.begin(), registered_.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  return absl::OkStatus();
}

int UringQueue::FindRegistered(const char* p, uint64_t n) const {
  auto it = std::upper_bound(registered_.begin(), registered_.end(), p,
                             [](const char* q, const Registered& r) { return q < r.begin; });
  if (it == registered_.begin()) return -1;
  --it;
  return p + n <= it->end ? it->index : -1;
}

void UringQueue::SubmitWithCallback(absl::Span<const IoRequest> batch, IoDone done) {
  auto ops = MakeInFlight(batch, std::move(done), faults_, counters_);
  if (ops.empty()) return;  // done already has the verdict
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& op : ops) incoming_.push_back(std::move(op));
  }
  Wake();
}

bool UringQueue::TakeIncoming() {
  std::deque<Command*> commands;
  bool stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& op : incoming_) ready_.push_back(std::move(op));
    incoming_.clear();
    commands.swap(commands_);
    stop = stop_;
  }
  for (Command* c : commands) c->result.set_value(DoRegister(c->buffers));
  return !(stop && ready_.empty() && free_slots_.size() == slots_.size());
}

void UringQueue::FillSq() {
  while (!ready_.empty() && !free_slots_.empty()) {
    std::unique_ptr<InFlight> op = std::move(ready_.front());
    ready_.pop_front();
    if (op->remaining() == 0 || op->injected_errno != 0) {
      const int64_t result = op->remaining() == 0 ? 0 : -std::exchange(op->injected_errno, 0);
      Complete(std::move(op), result);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // cannot happen with depth + 1 entries; retry after the next submit
      ready_.push_front(std::move(op));
      return;
    }
    const unsigned n = static_cast<unsigned>(std::min(faults_.Clip(op->remaining()), kMaxBytesPerSqe));
    const int fixed = FindRegistered(op->cursor(), n);
    const bool read = op->req.op == IoOp::kRead;
    if (fixed >= 0) {
      counters_.fixed.fetch_add(1, std::memory_order_relaxed);
      if (read)
        io_uring_prep_read_fixed(sqe, op->req.fd, op->cursor(), n, op->position(), fixed);
      else
        io_uring_prep_write_fixed(sqe, op->req.fd, op->cursor(), n, op->position(), fixed);
    } else if (read) {
      io_uring_prep_read(sqe, op->req.fd, op->cursor(), n, op->position());
    } else {
      io_uring_prep_write(sqe, op->req.fd, op->cursor(), n, op->position());
    }
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    io_uring_sqe_set_data64(sqe, slot);
    slots_[slot] = std::move(op);
  }
}

void UringQueue::Complete(std::unique_ptr<InFlight> op, int64_t result) {
  absl::Status error;
  switch (AdvanceTransfer(*op, result, &error)) {
    case Advance::kComplete:
      FinishRequest(std::move(op), absl::OkStatus(), counters_);
      break;
    case Advance::kFailed:
      FinishRequest(std::move(op), std::move(error), counters_);
      break;
    case Advance::kResubmit:
      counters_.resubmits.fetch_add(1, std::memory_order_relaxed);
      ready_.push_front(std::move(op));
      break;
  }
}

void UringQueue::Reap() {
  io_uring_cqe* cqe;
  unsigned head;
  unsigned seen = 0;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    const uint64_t tag = io_uring_cqe_get_data64(cqe);
    if (tag == kWakeTag) {
      wake_armed_ = false;
      continue;
    }
    std::unique_ptr<InFlight> op = std::move(slots_[tag]);
    free_slots_.push_back(static_cast<uint32_t>(tag));
    Complete(std::move(op), cqe->res);
  }
  io_uring_cq_advance(&ring_, seen);
}

void UringQueue::Loop() {
  while (TakeIncoming()) {
    FillSq();
    if (!wake_armed_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe != nullptr) {
        io_uring_prep_read(sqe, wake_fd_, &wake_buf_, sizeof(wake_buf_), 0);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        wake_armed_ = true;
      }
    }
    const int r = io_uring_submit_and_wait(&ring_, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      STRATA_LOG(Error) << "io_uring_submit_and_wait: " << ErrnoError("io_uring_enter", -r, __FILE__, __LINE__);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Reap();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> CreateUringQueue(const IoQueueOptions& options) {
  auto q = std::make_unique<UringQueue>(options);
  STRATA_RETURN_IF_ERROR(q->Start());
  return std::unique_ptr<IoQueue>(std::move(q));
}

}  // namespace strata::offload::internal

namespace strata::offload {
bool UringCompiledIn() { return true; }
}  // namespace strata::offload
