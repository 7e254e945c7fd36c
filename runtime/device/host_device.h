// The host implementation of Device / Stream / Event: each stream is a worker thread that runs its
// queue in order. Used on CPU-only builds and for every host-side schedule in tests.
#pragma once

#include "absl/strings/string_view.h"
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/device/device.h"

namespace strata::device {

class HostEvent final : public Event {
 public:
  HostEvent() : state_(std::make_shared<State>()) {}
  absl::Status Synchronize() override;
  bool Query() override;
  int64_t completed_ns() const override;

 private:
  friend class HostStream;
  // Shared with the stream tasks that complete or wait on it, so an event may be destroyed while a
  // recorded point is still queued (a dropped Work, a replaced fence) without a dangling reference.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;
    uint64_t completed = 0;
    absl::Status status;
    int64_t completed_ns = 0;
    void Complete(uint64_t gen, absl::Status s);
    absl::Status Wait(uint64_t gen);
  };
  uint64_t NextGeneration();
  uint64_t CurrentGeneration();
  std::shared_ptr<State> state_;
};

class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name);
  ~HostStream() override;  // drains the queue, then joins the worker
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  absl::string_view name() const override { return name_; }
  void Enqueue(HostTask task) override;
  void Record(Event& event) override;
  void WaitFor(Event& event) override;
  absl::Status Synchronize() override;
  absl::Status status() override;

 private:
  struct Item {
    HostTask task;
    bool always_run;  // event completions and waits run even after an error
  };
  void Push(HostTask task, bool always_run);
  void Run();

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  uint64_t enqueued_ = 0;
  uint64_t done_ = 0;
  bool stop_ = false;
  absl::Status status_;  // sticky; guarded by mu_
  std::thread worker_;
};

class HostDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kHost; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(absl::string_view name) override;
  std::unique_ptr<Event> CreateEvent() override;
};

}  // namespace strata::device
