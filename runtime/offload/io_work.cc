#include "runtime/offload/io_work.h"

#include <utility>

namespace strata::offload {

IoWork IoWork::Completed(absl::Status status) {
  IoPromise p;
  IoWork w = p.work();
  p.Complete(std::move(status));
  return w;
}

absl::Status IoWork::Wait() const {
  if (!state_) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  // A fresh Status, not a copy sharing the stored one's payload: the stored one is freed by whichever
  // thread drops the state last, ordered by the state's shared_ptr; a shared payload would be ordered
  // only by Abseil's own reference count, which race detectors cannot see in the system library.
  const absl::Status& s = state_->status;
  return s.ok() ? absl::OkStatus() : absl::Status(s.code(), s.message());
}

bool IoWork::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

void IoWork::StreamWait(device::Stream& stream) const {
  if (!state_) return;
  stream.Enqueue([w = *this]() { return w.Wait(); });
}

int64_t IoWork::completed_ns() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed_ns;
}

IoPromise::IoPromise() : state_(std::make_shared<internal::IoWorkState>()) {}

IoPromise::~IoPromise() {
  if (state_) Complete(absl::InternalError("an offload I/O was dropped without completing (internal bug)"));
}

IoPromise& IoPromise::operator=(IoPromise&& o) noexcept {
  if (this != &o) {
    if (state_) Complete(absl::InternalError("an offload I/O promise was replaced before completing"));
    state_ = std::move(o.state_);
  }
  return *this;
}

void IoPromise::Complete(absl::Status status) {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->done = true;
      state_->status = std::move(status);
      state_->completed_ns = device::NowNs();
    }
  }
  state_->cv.notify_all();
  state_.reset();
}

absl::Status WaitAll(absl::Span<const IoWork> works) {
  absl::Status first;
  for (const IoWork& w : works) {
    absl::Status s = w.Wait();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace strata::offload
