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
  std::lock_guard<std::mutex> lock(mu_);
  return ++recorded_;
}

void HostEvent::Complete(uint64_t gen, absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gen > completed_) {
      completed_ = gen;
      status_ = std::move(status);
      completed_ns_ = NowNs();
    }
  }
  cv_.notify_all();
}

absl::Status HostEvent::WaitGeneration(uint64_t gen) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= gen; });
  return status_;
}

absl::Status HostEvent::Synchronize() {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = recorded_;
  }
  return WaitGeneration(gen);
}

bool HostEvent::Query() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= recorded_;
}

int64_t HostEvent::completed_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ns_;
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
  Push([this, &e, gen]() -> absl::Status {
         absl::Status s;
         {
           std::lock_guard<std::mutex> lock(mu_);
           s = status_;
         }
         e.Complete(gen, s);
         return absl::OkStatus();
       },
       /*always_run=*/true);
}

void HostStream::WaitFor(Event& event) {
  auto& e = static_cast<HostEvent&>(event);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e.mu_);
    gen = e.recorded_;
  }
  Push([&e, gen]() { return e.WaitGeneration(gen); }, /*always_run=*/true);
}

absl::Status HostStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = enqueued_;
  cv_.wait(lock, [&] { return done_ >= target; });
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
