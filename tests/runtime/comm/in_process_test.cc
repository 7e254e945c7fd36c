// Tests for runtime/comm/in_process: the conformance suite at world sizes 1-4 (each rank a thread),
// plus the failure behaviour that needs a misbehaving rank: a rank that never arrives, mismatched
// collectives, stickiness after a failure, Abort(), and a barrier's ordering across ranks.
#include "runtime/comm/in_process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::comm {
namespace {

using conformance::Gate;
using conformance::HostArray;
using conformance::RankHarness;
using ::testing::Contains;
using ::testing::HasSubstr;

// Runs `body` once per rank, each on its own thread with its own host device and stream.
void RunRanks(int world, const Options& options, const std::function<void(RankHarness&)>& body) {
  auto comms = CreateInProcessGroup(world, options);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      device::HostDevice dev;
      auto stream = dev.CreateStream(absl::StrCat("rank", r));
      ASSERT_TRUE(stream.ok()) << stream.status();
      RankHarness h{*comms[r], dev, **stream};
      EXPECT_EQ(h.comm.rank(), r);
      EXPECT_EQ(h.comm.size(), world);
      body(h);
      // Drain before the group goes away. Bodies wait for the work that uses their own buffers and
      // check its status; a failed stream's status here is expected in the error tests.
      const absl::Status drained = (*stream)->Synchronize();
      (void)drained;
    });
  }
  for (auto& t : threads) t.join();
}

Options WithTimeout(int64_t timeout_ms) {
  Options o;
  o.timeout_ms = timeout_ms;
  o.name = "test";
  return o;
}

// ---- The conformance suite ----

class InProcessConformance : public ::testing::TestWithParam<std::tuple<size_t, int>> {};

TEST_P(InProcessConformance, Passes) {
  const auto& [index, world] = GetParam();
  // Generous: a collective that should succeed never waits this long, a broken one fails the test.
  RunRanks(world, WithTimeout(20000), conformance::Cases()[index].body);
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, InProcessConformance,
    ::testing::Combine(::testing::Range(size_t{0}, conformance::Cases().size()), ::testing::Values(1, 2, 3, 4)),
    [](const ::testing::TestParamInfo<std::tuple<size_t, int>>& info) {
      return absl::StrCat(conformance::Cases()[std::get<0>(info.param)].name, "_World", std::get<1>(info.param));
    });

// ---- Failures that need a misbehaving rank ----

constexpr int64_t kShortTimeoutMs = 300;

int64_t ElapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

// The ranks listed after "waiting for rank(s) " in a timeout message.
std::vector<std::string> MissingRanks(absl::string_view message) {
  constexpr absl::string_view kKey = "waiting for rank(s) ";
  const size_t at = message.find(kKey);
  if (at == absl::string_view::npos) return {};
  const absl::string_view rest = message.substr(at + kKey.size());
  return absl::StrSplit(rest.substr(0, rest.find(' ')), ',');
}

TEST(InProcessCommunicator, MissingRankMakesOthersFailWithDeadlineExceededNamingIt) {
  // Measured from before any rank starts: whichever rank times out first waited the full deadline
  // after its own arrival, and no rank returns before that.
  const auto start = std::chrono::steady_clock::now();
  RunRanks(3, WithTimeout(kShortTimeoutMs), [&](RankHarness& h) {
    if (h.comm.rank() == 2) return;  // never arrives
    HostArray buf(DType::kF32, 8);
    const absl::Status st = h.comm.AllReduce(buf.data(), buf.data(), 8, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    const int64_t ms = ElapsedMs(start);
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << h.comm.rank() << ": " << st;
    EXPECT_THAT(MissingRanks(st.message()), Contains("2")) << "the missing rank must be named: " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("all_reduce #0 on 'test'"));
    EXPECT_GE(ms, kShortTimeoutMs) << "rank " << h.comm.rank() << " gave up before the deadline";
    EXPECT_LT(ms, kShortTimeoutMs + 5000) << "rank " << h.comm.rank() << " did not give up at the deadline";
  });
}

TEST(InProcessCommunicator, SplitWithAMissingRankFailsWithDeadlineExceededNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  // Ranks 0 and 1 split together, however slow their setup: the deadline finds only rank 2 missing.
  std::latch set_up(2);
  RunRanks(3, WithTimeout(kShortTimeoutMs), [&](RankHarness& h) {
    if (h.comm.rank() == 2) return;  // never splits
    set_up.arrive_and_wait();
    auto part = h.comm.Split(0, h.comm.rank(), "part");
    EXPECT_EQ(part.status().code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << h.comm.rank() << ": " << part.status();
    EXPECT_THAT(MissingRanks(part.status().message()), ::testing::ElementsAre("2")) << part.status();
    EXPECT_THAT(std::string(part.status().message()), HasSubstr("split #0 of 'test' into 'part'"));
    EXPECT_GE(ElapsedMs(start), kShortTimeoutMs);
  });
}

// A dead rank inside one part of a split is named by the part's collectives (part ranks), and its
// peers in the other part are not held up. The split itself runs under a long deadline (however late a
// rank's thread starts); only the parts get the short one.
TEST(InProcessCommunicator, MissingRankInOnePartFailsOnlyThatPartsCollective) {
  RunRanks(4, WithTimeout(20000), [&](RankHarness& h) {
    auto part = h.comm.Split(h.comm.rank() / 2, h.comm.rank(), "group", kShortTimeoutMs);
    ASSERT_TRUE(part.ok()) << part.status();
    if (h.comm.rank() == 3) return;  // dies after the split
    HostArray buf(DType::kF32, 4);
    const absl::Status st = (*part)->AllReduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    if (h.comm.rank() < 2) {
      EXPECT_TRUE(st.ok()) << "rank " << h.comm.rank() << ": " << st;
    } else {
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
      EXPECT_THAT(MissingRanks(st.message()), ::testing::ElementsAre("1")) << "part rank 1 is world rank 3: " << st;
    }
  });
}

TEST(InProcessCommunicator, AbortOnAPartFailsTheWholeWorld) {
  Gate split, aborted;
  RunRanks(2, WithTimeout(5000), [&](RankHarness& h) {
    auto part = h.comm.Split(h.comm.rank(), 0, "alone");
    ASSERT_TRUE(part.ok()) << part.status();
    if (h.comm.rank() == 1) split.Open();  // rank 1 has left the split: the abort cannot reach it there
    if (h.comm.rank() == 0) {
      EXPECT_TRUE(split.Wait());
      (*part)->Abort(absl::InternalError("boom"));
      aborted.Open();
      return;
    }
    EXPECT_TRUE(aborted.Wait());
    const absl::Status st = h.comm.Barrier(h.stream).Wait();
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("boom"));
  });
}

TEST(InProcessCommunicator, FailedCollectiveMakesTheStreamStickyAndLateArrivalsFail) {
  constexpr int64_t kTimeoutMs = 500;
  Gate rank0_gave_up;
  RunRanks(2, WithTimeout(kTimeoutMs), [&](RankHarness& h) {
    HostArray buf(DType::kF32, 4);
    if (h.comm.rank() == 1) {
      // Arrives only after rank 0 has given up on collective #0: it must fail too, not wait or succeed.
      EXPECT_TRUE(rank0_gave_up.Wait());
      const absl::Status late = h.comm.Barrier(h.stream).Wait();
      EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << "late rank 1: " << late;
      return;
    }
    const absl::Status first = h.comm.Barrier(h.stream).Wait();
    rank0_gave_up.Open();
    EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
    EXPECT_THAT(MissingRanks(first.message()), ::testing::ElementsAre("1")) << first;
    // Later collectives on the failed stream return the first error at once, without waiting again.
    const auto start = std::chrono::steady_clock::now();
    const absl::Status later =
        h.comm.AllReduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    EXPECT_EQ(later, first) << "a later collective on the failed stream must return the first error";
    EXPECT_LT(ElapsedMs(start), kTimeoutMs) << "the skipped collective waited for peers";
    EXPECT_EQ(h.stream.Synchronize(), first);
  });
}

TEST(InProcessCommunicator, CountMismatchIsInvalidArgumentNamingTheOtherRank) {
  RunRanks(2, WithTimeout(5000), [](RankHarness& h) {
    const int rank = h.comm.rank(), other = 1 - rank;
    const size_t count = rank == 0 ? 4 : 5;
    HostArray send(DType::kF32, count), recv(DType::kF32, 2 * count);
    const Work w = h.comm.AllGather(send.data(), recv.data(), count, DType::kF32, h.stream);
    const absl::Status st = w.Wait();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat("rank ", other, " called")));
    EXPECT_THAT(std::string(st.message()), HasSubstr("count=5"));
    // A stream that waits for the failed collective fails too, and skips its work.
    device::HostDevice dev;
    auto consumer = dev.CreateStream("consumer");
    ASSERT_TRUE(consumer.ok());
    bool ran = false;
    w.StreamWait(**consumer);
    (*consumer)->Enqueue([&] {
      ran = true;
      return absl::OkStatus();
    });
    EXPECT_EQ((*consumer)->Synchronize().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(ran) << "rank " << rank << ": work ordered after a failed collective ran";
  });
}

TEST(InProcessCommunicator, DifferentCollectivesAtTheSameStepAreInvalidArgument) {
  RunRanks(3, WithTimeout(5000), [](RankHarness& h) {
    HostArray a(DType::kF32, 6), b(DType::kF32, 6);
    const absl::Status st =
        h.comm.rank() == 1 ? h.comm.Broadcast(a.data(), 6, DType::kF32, 0, h.stream).Wait()
                           : h.comm.AllReduce(a.data(), b.data(), 6, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "rank " << h.comm.rank() << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(h.comm.rank() == 1 ? "rank 0 called all_reduce"
                                                                          : "rank 1 called broadcast"));
  });
}

TEST(InProcessCommunicator, AbortFromOneRankFailsTheOthersPendingCollectives) {
  // A long timeout: the others must fail because of the abort, not because of the deadline.
  std::atomic<int> pending{0};
  Gate both_pending;
  RunRanks(3, WithTimeout(20000), [&](RankHarness& h) {
    const int rank = h.comm.rank();
    if (rank == 0) {
      EXPECT_TRUE(both_pending.Wait());
      h.comm.Abort(absl::InternalError("loss is NaN at step 12"));
      const absl::Status after = h.comm.Barrier(h.stream).Wait();
      EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << "rank 0 after its own abort: " << after;
      return;
    }
    HostArray buf(DType::kF32, 16);
    h.stream.Enqueue([&] {  // runs right before the collective on this rank's stream
      if (++pending == 2) both_pending.Open();
      return absl::OkStatus();
    });
    const auto start = std::chrono::steady_clock::now();
    const absl::Status st =
        h.comm.AllReduce(buf.data(), buf.data(), 16, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << "rank " << rank << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("rank 0 aborted"));
    EXPECT_THAT(std::string(st.message()), HasSubstr("loss is NaN at step 12"));
    EXPECT_LT(ElapsedMs(start), 10000) << "rank " << rank << " waited for the deadline instead of the abort";
  });
}

TEST(InProcessCommunicator, NoRankLeavesABarrierBeforeEveryRankReachedIt) {
  constexpr int kWorld = 4, kRounds = 20;
  std::atomic<int> arrived[kRounds] = {};
  RunRanks(kWorld, WithTimeout(20000), [&](RankHarness& h) {
    for (int round = 0; round < kRounds; ++round) {
      h.stream.Enqueue([&, round] {
        ++arrived[round];
        return absl::OkStatus();
      });
      h.comm.Barrier(h.stream);
      int seen = -1;
      h.stream.Enqueue([&, round] {
        seen = arrived[round].load();
        return absl::OkStatus();
      });
      EXPECT_TRUE(h.stream.Synchronize().ok());
      EXPECT_EQ(seen, kWorld) << "rank " << h.comm.rank() << ", round " << round << ": left the barrier after "
                              << seen << " of " << kWorld << " ranks arrived";
    }
  });
}

}  // namespace
}  // namespace strata::comm
