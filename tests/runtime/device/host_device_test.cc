// Tests for runtime/device/host_device: in-order streams, real overlap between streams, events across
// streams and from the host, sticky errors, and event lifetime while a Record is still queued.
//
// No test relies on timing: ordering is forced with gates (a task blocks until the test opens it).
// Every gate wait has a long failsafe so that a broken stream fails the test instead of hanging it.
#include "runtime/device/host_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::device {
namespace {

using ::testing::HasSubstr;

constexpr auto kFailsafe = std::chrono::seconds(20);

// A one-shot latch with a failsafe timeout.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // True once opened; false after the failsafe (the test then fails on the returned status).
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kFailsafe, [&] { return open_; });
  }
  // A task that blocks its stream until the gate opens.
  HostTask Task() {
    return [this]() -> absl::Status {
      return Wait() ? absl::OkStatus() : absl::DeadlineExceededError("gate never opened (streams serialised?)");
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

std::unique_ptr<Stream> MakeStream(HostDevice& dev, absl::string_view name) {
  auto s = dev.CreateStream(name);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

TEST(HostDevice, CreatesHostStreamsWithTheirNamesAndEvents) {
  HostDevice dev;
  EXPECT_EQ(dev.kind(), DeviceKind::kHost);
  auto s = MakeStream(dev, "gather");
  EXPECT_EQ(s->name(), "gather");
  auto e = dev.CreateEvent();
  ASSERT_NE(e, nullptr);
}

TEST(HostStream, RunsTasksInEnqueueOrderOnOneWorkerThread) {
  HostDevice dev;
  auto s = MakeStream(dev, "s");
  std::vector<int> order;  // touched only by the worker until Synchronize returns
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 200; ++i) {
    s->Enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(s->Synchronize().ok());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(order[i], i) << "position " << i << ": expected task " << i << ", actual task " << order[i];
    EXPECT_EQ(threads[i], threads[0]) << "task " << i << " ran on another thread";
  }
  EXPECT_NE(threads[0], std::this_thread::get_id()) << "tasks must run on the stream's worker";
}

TEST(HostStream, TwoStreamsRunTasksAtTheSameTime) {
  // Each task waits for the other one to have started: only possible if both run at once.
  HostDevice dev;
  Gate a_started, b_started;
  auto a = MakeStream(dev, "a");
  auto b = MakeStream(dev, "b");
  a->Enqueue([&]() -> absl::Status {
    a_started.Open();
    return b_started.Wait() ? absl::OkStatus() : absl::DeadlineExceededError("b never started while a ran");
  });
  b->Enqueue([&]() -> absl::Status {
    b_started.Open();
    return a_started.Wait() ? absl::OkStatus() : absl::DeadlineExceededError("a never started while b ran");
  });
  EXPECT_TRUE(a->Synchronize().ok());
  EXPECT_TRUE(b->Synchronize().ok());
}

TEST(HostStream, OtherStreamProgressesWhileOneWaitsForItsLaterEvent) {
  // A: [a0: signal "A is at the wait", WaitFor(e), a1]. B: [b0: waits until A is at the wait, Record(e)].
  // B's task runs while A's worker is blocked in the wait, and a1 sees b0 done.
  HostDevice dev;
  Gate a_at_wait;
  auto a = MakeStream(dev, "a");
  auto b = MakeStream(dev, "b");
  auto e = dev.CreateEvent();
  std::atomic<bool> b0_done{false};
  bool a1_saw_b0 = false;
  b->Enqueue(a_at_wait.Task());
  b->Enqueue([&] {
    b0_done = true;
    return absl::OkStatus();
  });
  b->Record(*e);
  a->Enqueue([&] {
    a_at_wait.Open();
    return absl::OkStatus();
  });
  a->WaitFor(*e);
  a->Enqueue([&] {
    a1_saw_b0 = b0_done.load();
    return absl::OkStatus();
  });
  EXPECT_TRUE(a->Synchronize().ok());
  EXPECT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(a1_saw_b0) << "a task after WaitFor ran before the recorded point completed";
}

TEST(HostStream, WaitForCapturesTheRecordedPointAtCallTime) {
  // A waits for the first Record of e; a later re-record behind a closed gate must not hold A back.
  HostDevice dev;
  Gate first, second;
  // If WaitFor wrongly waited for the later point, A would block until `second` opens: a watchdog opens
  // it after the failsafe so that the test then fails on `a_ran_before_second` instead of hanging.
  std::thread watchdog([&] {
    if (!second.Wait()) second.Open();
  });
  auto a = MakeStream(dev, "a");
  auto b = MakeStream(dev, "b");
  auto e = dev.CreateEvent();
  std::atomic<bool> second_opened{false};
  bool a_ran_before_second = false;
  b->Enqueue(first.Task());
  b->Record(*e);
  a->WaitFor(*e);
  a->Enqueue([&] {
    a_ran_before_second = !second_opened.load();
    return absl::OkStatus();
  });
  b->Enqueue(second.Task());
  b->Record(*e);
  first.Open();
  EXPECT_TRUE(a->Synchronize().ok());
  EXPECT_TRUE(a_ran_before_second) << "A waited for a point recorded after its WaitFor";
  EXPECT_FALSE(e->Query()) << "the second recorded point cannot be complete while its gate is closed";
  second_opened = true;
  second.Open();
  EXPECT_TRUE(e->Synchronize().ok());
  EXPECT_TRUE(e->Query());
  watchdog.join();
}

TEST(HostEvent, HostSynchronizeReturnsAfterTheRecordedPointRan) {
  HostDevice dev;
  Gate gate;
  auto s = MakeStream(dev, "s");
  auto e = dev.CreateEvent();
  std::atomic<bool> before_record{false};
  s->Enqueue(gate.Task());
  s->Enqueue([&] {
    before_record = true;
    return absl::OkStatus();
  });
  s->Record(*e);
  EXPECT_FALSE(e->Query()) << "recorded point behind a closed gate reported complete";
  EXPECT_EQ(e->completed_ns(), 0) << "completed_ns must be 0 before the first completion";
  const int64_t opened_ns = NowNs();
  gate.Open();
  EXPECT_TRUE(e->Synchronize().ok());
  EXPECT_TRUE(before_record.load()) << "Event::Synchronize returned before the work recorded before it";
  EXPECT_TRUE(e->Query());
  EXPECT_GE(e->completed_ns(), opened_ns);
  EXPECT_LE(e->completed_ns(), NowNs());
}

TEST(HostEvent, NeverRecordedEventIsComplete) {
  HostDevice dev;
  auto e = dev.CreateEvent();
  EXPECT_TRUE(e->Query());
  EXPECT_TRUE(e->Synchronize().ok());
  EXPECT_EQ(e->completed_ns(), 0);
  // Waiting on it from a stream does not block the stream either.
  auto s = MakeStream(dev, "s");
  s->WaitFor(*e);
  EXPECT_TRUE(s->Synchronize().ok());
}

TEST(HostEvent, ReRecordingReplacesTheCompletedPoint) {
  HostDevice dev;
  Gate gate;
  auto s = MakeStream(dev, "s");
  auto e = dev.CreateEvent();
  s->Record(*e);
  ASSERT_TRUE(e->Synchronize().ok());
  ASSERT_TRUE(e->Query());
  s->Enqueue(gate.Task());
  s->Record(*e);
  EXPECT_FALSE(e->Query()) << "re-recorded event still reports the old, completed point";
  gate.Open();
  EXPECT_TRUE(e->Synchronize().ok());
  EXPECT_TRUE(e->Query());
}

TEST(HostEvent, CompletedNsIsMonotoneAlongAStreamAndAcrossReRecords) {
  HostDevice dev;
  auto s = MakeStream(dev, "s");
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < 32; ++i) {
    events.push_back(dev.CreateEvent());
    s->Enqueue([] { return absl::OkStatus(); });
    s->Record(*events.back());
  }
  ASSERT_TRUE(s->Synchronize().ok());
  for (int i = 1; i < 32; ++i) {
    EXPECT_GT(events[i - 1]->completed_ns(), 0) << "event " << i - 1;
    EXPECT_LE(events[i - 1]->completed_ns(), events[i]->completed_ns())
        << "event " << i << ": expected completed_ns >= " << events[i - 1]->completed_ns() << ", actual "
        << events[i]->completed_ns();
  }
  auto e = dev.CreateEvent();
  int64_t last = 0;
  for (int i = 0; i < 16; ++i) {
    s->Record(*e);
    ASSERT_TRUE(e->Synchronize().ok());
    EXPECT_GE(e->completed_ns(), last) << "re-record " << i;
    EXPECT_GT(e->completed_ns(), 0) << "re-record " << i;
    last = e->completed_ns();
  }
}

TEST(HostStream, FailedTaskMakesLaterTasksSkipAndSynchronizeReturnTheFirstError) {
  HostDevice dev;
  auto s = MakeStream(dev, "s");
  int ran = 0;
  s->Enqueue([&] {
    ++ran;
    return absl::OkStatus();
  });
  s->Enqueue([] { return absl::DataLossError("first failure"); });
  s->Enqueue([&] {
    ++ran;
    return absl::OkStatus();
  });
  s->Enqueue([] { return absl::InternalError("second failure"); });
  absl::Status st = s->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(st.message(), "first failure");
  EXPECT_EQ(ran, 1) << "tasks after the failure must be skipped";
  // Still sticky for work enqueued later, and Synchronize keeps returning the same error.
  s->Enqueue([&] {
    ++ran;
    return absl::OkStatus();
  });
  st = s->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(ran, 1);
}

TEST(HostStream, StatusSaysTheStickyErrorWithoutWaiting) {
  HostDevice dev;
  auto s = MakeStream(dev, "s");
  EXPECT_TRUE(s->status().ok());
  Gate gate;
  s->Enqueue(gate.Task());
  s->Enqueue([] { return absl::DataLossError("failed"); });
  EXPECT_TRUE(s->status().ok()) << "the failing task has not run yet";
  gate.Open();
  EXPECT_EQ(s->Synchronize().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s->status().code(), absl::StatusCode::kDataLoss);
}

TEST(HostStream, EventsRecordedAfterAFailureCompleteWithTheError) {
  HostDevice dev;
  auto s = MakeStream(dev, "s");
  auto before = dev.CreateEvent();
  auto after = dev.CreateEvent();
  s->Record(*before);
  s->Enqueue([] { return absl::UnavailableError("peer gone"); });
  s->Record(*after);
  const absl::Status sb = before->Synchronize();
  EXPECT_TRUE(sb.ok()) << "an event recorded before the failure carries it: " << sb;
  const absl::Status sa = after->Synchronize();  // must not hang
  EXPECT_EQ(sa.code(), absl::StatusCode::kUnavailable) << sa;
  EXPECT_THAT(std::string(sa.message()), HasSubstr("peer gone"));
  EXPECT_TRUE(after->Query());
  EXPECT_GT(after->completed_ns(), 0);
}

TEST(HostStream, WaitingOnAFailedEventFailsTheWaitingStream) {
  HostDevice dev;
  auto a = MakeStream(dev, "a");
  auto b = MakeStream(dev, "b");
  auto e = dev.CreateEvent();
  a->Enqueue([] { return absl::PermissionDeniedError("cannot open shard"); });
  a->Record(*e);
  bool ran = false;
  b->WaitFor(*e);
  b->Enqueue([&] {
    ran = true;
    return absl::OkStatus();
  });
  const absl::Status st = b->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_FALSE(ran) << "work after waiting on a failed event ran";
  // The failure is sticky on the waiting stream now.
  EXPECT_EQ(b->Synchronize().code(), absl::StatusCode::kPermissionDenied);
}

TEST(HostEvent, DestroyingAnEventWhileItsRecordAndWaitAreQueuedIsSafe) {
  HostDevice dev;
  Gate gate;
  auto a = MakeStream(dev, "a");
  auto b = MakeStream(dev, "b");
  a->Enqueue(gate.Task());
  {
    std::unique_ptr<Event> e = dev.CreateEvent();
    a->Record(*e);
    b->WaitFor(*e);
  }  // destroyed while both the completion (on a) and the wait (on b) are queued
  bool b_ran = false;
  b->Enqueue([&] {
    b_ran = true;
    return absl::OkStatus();
  });
  gate.Open();
  EXPECT_TRUE(a->Synchronize().ok());
  EXPECT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(b_ran);
}

TEST(HostEvent, DroppingTheLastSharedPtrWhileItsRecordIsQueuedIsSafe) {
  HostDevice dev;
  Gate gate;
  auto s = MakeStream(dev, "s");
  s->Enqueue(gate.Task());
  std::shared_ptr<Event> e(dev.CreateEvent());  // as a Work holds it
  std::weak_ptr<Event> weak = e;
  s->Record(*e);
  e.reset();
  EXPECT_TRUE(weak.expired()) << "the stream must not keep the Event object itself alive";
  gate.Open();
  EXPECT_TRUE(s->Synchronize().ok());
}

TEST(HostStream, SynchronizeOfAnIdleStreamReturnsOkAtOnce) {
  HostDevice dev;
  auto s = MakeStream(dev, "idle");
  EXPECT_TRUE(s->Synchronize().ok());
  s->Enqueue([] { return absl::OkStatus(); });
  EXPECT_TRUE(s->Synchronize().ok());
  EXPECT_TRUE(s->Synchronize().ok()) << "a drained stream is idle again";
}

TEST(HostStream, DestructorRunsEverythingStillQueued) {
  HostDevice dev;
  Gate gate;
  std::atomic<int> ran{0};
  {
    auto s = MakeStream(dev, "s");
    s->Enqueue(gate.Task());
    for (int i = 0; i < 10; ++i) {
      s->Enqueue([&] {
        ++ran;
        return absl::OkStatus();
      });
    }
    gate.Open();
  }
  EXPECT_EQ(ran.load(), 10) << "the destructor must drain the queue before joining";
}

TEST(HostStream, SynchronizeFromAnotherThreadSeesAllEarlierWork) {
  HostDevice dev;
  Gate gate;
  auto s = MakeStream(dev, "s");
  std::atomic<int> ran{0};
  s->Enqueue(gate.Task());
  for (int i = 0; i < 5; ++i) {
    s->Enqueue([&] {
      ++ran;
      return absl::OkStatus();
    });
  }
  absl::Status from_thread;
  int seen = -1;
  std::thread waiter([&] {
    from_thread = s->Synchronize();
    seen = ran.load();
  });
  gate.Open();
  waiter.join();
  EXPECT_TRUE(from_thread.ok()) << from_thread;
  EXPECT_EQ(seen, 5);
}

}  // namespace
}  // namespace strata::device
