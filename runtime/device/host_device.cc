#include "runtime/device/host_device.h"

#include <chrono>
#include <utility>

#include "runtime/base/status.h"

namespace strata::device {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- HostEvent ----

uint64_t HostEvent::NextGeneration() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return ++state_->recorded;
}

uint64_t HostEvent::CurrentGeneration() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->recorded;
}

void HostEvent::State::Complete(uint64_t gen, absl::Status s) {
  std::lock_guard<std::mutex> lock(mu);
  if (gen > completed) {
    completed = gen;
    status = std::move(s);
    completed_ns = NowNs();
  }
  cv.notify_all();  // under the lock: waiters cannot run ahead while we still touch the state
}

absl::Status HostEvent::State::Wait(uint64_t gen) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return completed >= gen; });
  return status;
}

absl::Status HostEvent::Synchronize() { return state_->Wait(CurrentGeneration()); }

bool HostEvent::Query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

int64_t HostEvent::completed_ns() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed_ns;
}

// ---- HostStream ----

HostStream::HostStream(std::string name) : name_(std::move(name)) {
  worker_ = std::thread([this] { Run(); });
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void HostStream::Push(HostTask task, bool always_run) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Item{std::move(task), always_run});
    ++enqueued_;
  }
  cv_.notify_all();
}

void HostStream::Enqueue(HostTask task) { Push(std::move(task), /*always_run=*/false); }

void HostStream::Record(Event& event) {
  auto& e = static_cast<HostEvent&>(event);
  const uint64_t gen = e.NextGeneration();
  Push([this, state = e.state_, gen]() -> absl::Status {
         absl::Status s;
         {
           std::lock_guard<std::mutex> lock(mu_);
           s = status_;
         }
         state->Complete(gen, s);
         return absl::OkStatus();
       },
       /*always_run=*/true);
}

void HostStream::WaitFor(Event& event) {
  auto& e = static_cast<HostEvent&>(event);
  Push([state = e.state_, gen = e.CurrentGeneration()]() { return state->Wait(gen); }, /*always_run=*/true);
}

absl::Status HostStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = enqueued_;
  cv_.wait(lock, [&] { return done_ >= target; });
  return status_;
}

absl::Status HostStream::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void HostStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !status_.ok() && !item.always_run;
    lock.unlock();
    absl::Status s = skip ? absl::OkStatus() : item.task();
    lock.lock();
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    ++done_;
    cv_.notify_all();
  }
}

// ---- HostDevice ----

absl::StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream(absl::string_view name) {
  return std::unique_ptr<Stream>(new HostStream(std::string(name)));
}

std::unique_ptr<Event> HostDevice::CreateEvent() { return std::make_unique<HostEvent>(); }

}  // namespace strata::device
