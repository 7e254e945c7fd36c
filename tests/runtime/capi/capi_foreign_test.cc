// strata_comm_create_foreign (docs/decisions/0033): the Communicator conformance suite over a trainer's
// communicator made of C callbacks (foreign_test_util.h: the in-process back-end underneath, a map as its
// store), at world sizes 1-4; then what the foreign back-end adds: a rank that never arrives is named by the
// liveness check over the store, a trainer's collective that blocks past Strata's deadline ends at Strata's
// deadline, a callback's error is the collective's and sticky, failure notices travel through the store, the
// checks of the struct and of what dup returns, abort, and ownership (every communicator destroyed once).
#include <chrono>
#include <latch>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/capi/capi_internal.h"
#include "tests/runtime/capi/capi_test_util.h"
#include "tests/runtime/capi/foreign_test_util.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::capi_test {
namespace {

namespace conformance = comm::conformance;
using ::testing::HasSubstr;

comm::Communicator& Of(strata_comm* c) { return *c->comm; }

int64_t MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

class ForeignConformance : public ::testing::TestWithParam<std::tuple<size_t, int>> {};

// Conformance case `index` on rank `rank` of `world`, over `sc`, on a stream of its own.
void RunCase(strata_comm* sc, int rank, int world, size_t index) {
  device::HostDevice dev;
  auto stream = dev.CreateStream(absl::StrCat("rank", rank));
  ASSERT_TRUE(stream.ok()) << stream.status();
  conformance::RankHarness h{Of(sc), dev, **stream};
  EXPECT_EQ(h.comm.rank(), rank);
  EXPECT_EQ(h.comm.size(), world);
  conformance::Cases()[index].body(h);
  static_cast<void>((*stream)->Synchronize());  // the error cases leave a failed stream
}

TEST_P(ForeignConformance, Passes) {
  const auto& [index, world] = GetParam();
  auto job = std::make_shared<ForeignJobState>();
  RunForeignRanks(world, 20000, job, [&](int rank, strata_comm* sc) { RunCase(sc, rank, world, index); });
}

INSTANTIATE_TEST_SUITE_P(AllCases, ForeignConformance,
                         ::testing::Combine(::testing::Range(size_t{0}, conformance::Cases().size()),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, int>>& info) {
                           return absl::StrCat(conformance::Cases()[std::get<0>(info.param)].name, "_World",
                                               std::get<1>(info.param));
                         });

// strata_comm_create_shm over the foreign communicator, as strata.torch makes it under torchrun (decision 0053):
// the conformance suite on the shared-memory communicator.
class ShmOverForeignConformance : public ::testing::TestWithParam<std::tuple<size_t, int>> {};

TEST_P(ShmOverForeignConformance, Passes) {
  const auto& [index, world] = GetParam();
  auto job = std::make_shared<ForeignJobState>();
  RunForeignRanks(world, 20000, job, [&](int rank, strata_comm* sc) {
    strata_comm* shm = nullptr;
    ASSERT_EQ(strata_comm_create_shm(sc, 20000, &shm), STRATA_OK) << strata_last_error();
    RunCase(shm, rank, world, index);  // its stream is gone before the communicator
    EXPECT_EQ(strata_comm_destroy(shm), STRATA_OK);
  });
}

INSTANTIATE_TEST_SUITE_P(AllCases, ShmOverForeignConformance,
                         ::testing::Combine(::testing::Range(size_t{0}, conformance::Cases().size()),
                                            ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, int>>& info) {
                           return absl::StrCat(conformance::Cases()[std::get<0>(info.param)].name, "_World",
                                               std::get<1>(info.param));
                         });

// Rank 2 never issues the all-reduce, and the trainer's collectives would wait 10 minutes: Strata's wait ends at
// its own 1.5 s timeout, the liveness check names rank 2, and the communicator then fails at once. Ranks 0 and 1
// issue it together, however slow either one's setup, so that the first to begin its liveness check (the last
// 375 ms of its wait) sees the other's answer within it.
void ExpectTimeoutNamingRank2(bool with_store) {
  constexpr int64_t kTimeoutMs = 1500;
  auto job = std::make_shared<ForeignJobState>();
  job->trainer_timeout_ms = 600000;
  const auto start = std::chrono::steady_clock::now();
  std::latch set_up(2);
  RunForeignRanks(
      3, kTimeoutMs, job,
      [&](int rank, strata_comm* sc) {
        if (rank == 2) return;
        device::HostDevice dev;
        auto stream = dev.CreateStream("s");
        ASSERT_TRUE(stream.ok());
        conformance::HostArray buf(DType::kF32, 8);
        set_up.arrive_and_wait();
        const absl::Status s =
            Of(sc).AllReduce(buf.data(), buf.data(), 8, DType::kF32, comm::ReduceOp::kSum, **stream).Wait();
        const int64_t ms = MsSince(start);
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << rank << ": " << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce #0 on 'world' (rank "));
        EXPECT_THAT(std::string(s.message()), HasSubstr("the trainer's collective had not returned"));
        if (with_store) {
          EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 did not respond to a liveness check")) << s;
        } else {
          EXPECT_THAT(std::string(s.message()), HasSubstr("no key-value store")) << s;
        }
        EXPECT_GE(ms, kTimeoutMs) << "rank " << rank << " gave up before its deadline";
        EXPECT_LT(ms, kTimeoutMs + 10000) << "rank " << rank << " did not give up at its deadline";
        auto again = dev.CreateStream("again");
        ASSERT_TRUE(again.ok());
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status s2 = Of(sc).Barrier(**again).Wait();
        EXPECT_EQ(s2, s) << "a later collective fails at once with the first error";
        EXPECT_LT(MsSince(t0), kTimeoutMs);
      },
      [&](int, strata_foreign_comm* c) {
        if (!with_store) c->kv_set = nullptr, c->kv_get = nullptr;
      });
}

TEST(ForeignComm, AMissingRankEndsTheWaitAtStratasDeadlineNamingIt) { ExpectTimeoutNamingRank2(true); }

TEST(ForeignComm, WithoutAStoreATimeoutSaysTheMissingRanksAreUnknown) { ExpectTimeoutNamingRank2(false); }

// The trainer's own collective gives up first (its timeout 300 ms, Strata's 20 s): its message, with the
// liveness check naming the rank that never came.
TEST(ForeignComm, ATrainersTimeoutIsDiagnosedToo) {
  auto job = std::make_shared<ForeignJobState>();
  job->trainer_timeout_ms = 300;
  RunForeignRanks(3, 20000, job, [&](int rank, strata_comm* sc) {
    if (rank == 2) return;
    device::HostDevice dev;
    auto stream = dev.CreateStream("s");
    ASSERT_TRUE(stream.ok());
    conformance::HostArray send(DType::kF32, 4), recv(DType::kF32, 12);
    const absl::Status s = Of(sc).AllGather(send.data(), recv.data(), 4, DType::kF32, **stream).Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("failed in the trainer's collective: the all_gather callback "
                                                    "returned STRATA_ERR_DEADLINE_EXCEEDED"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 did not respond to a liveness check")) << s;
  });
}

// Rank 1's all_reduce callback fails without communicating; its error is its collective's, sticky; rank 1 then
// sends its failure notice, and rank 0, waiting in the trainer's collective, ends within a second naming it.
TEST(ForeignComm, ACallbacksErrorIsTheCollectivesAndANoticeEndsThePeersWait) {
  auto job = std::make_shared<ForeignJobState>();
  job->failing_rank = 1;
  job->trainer_timeout_ms = 600000;
  RunForeignRanks(2, 600000, job, [&](int rank, strata_comm* sc) {
    device::HostDevice dev;
    auto stream = dev.CreateStream("s");
    ASSERT_TRUE(stream.ok());
    conformance::HostArray buf(DType::kF32, 4);
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s =
        Of(sc).AllReduce(buf.data(), buf.data(), 4, DType::kF32, comm::ReduceOp::kSum, **stream).Wait();
    if (rank == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce #0 on 'world' (rank 1 of 2) failed in the "
                                                      "trainer's collective: the all_reduce callback returned "
                                                      "STRATA_ERR_INTERNAL: planted failure of rank 1's all_reduce"));
      auto again = dev.CreateStream("again");
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(Of(sc).Barrier(**again).Wait(), s) << "sticky";
      Of(sc).NotifyFailure(s);
      return;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(comm::IsPeerFailure(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 failed and will not join it"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("planted failure of rank 1's all_reduce"));
    EXPECT_LT(MsSince(start), 5000) << "the notice, not a deadline, ends the wait";
  });
}

// Rank 1 fails on its own and leaves; rank 0's collective fails at once in the trainer's transport (planted: as
// gloo's "Connection closed by peer" when a peer's process goes) before rank 1's notice reaches the store, 300 ms
// later. Rank 0's error is rank 1's notice, which names the cause, not the transport's error.
TEST(ForeignComm, ANoticeThatFollowsTheTrainersFailureNamesThePeer) {
  auto job = std::make_shared<ForeignJobState>();
  job->failing_rank = 0;
  RunForeignRanks(2, 600000, job, [&](int rank, strata_comm* sc) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Of(sc).NotifyFailure(absl::FailedPreconditionError("rank 1's own check failed"));
      return;
    }
    device::HostDevice dev;
    auto stream = dev.CreateStream("s");
    ASSERT_TRUE(stream.ok());
    conformance::HostArray buf(DType::kF32, 4);
    const absl::Status s =
        Of(sc).AllReduce(buf.data(), buf.data(), 4, DType::kF32, comm::ReduceOp::kSum, **stream).Wait();
    EXPECT_TRUE(comm::IsPeerFailure(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 failed and will not join it"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1's own check failed"));
  });
}

TEST(ForeignComm, ADupOfOtherRanksIsRefusedAndDestroyed) {
  auto job = std::make_shared<ForeignJobState>();
  job->wrong_dup_rank = 0;
  RunForeignRanks(2, 5000, job, [&](int rank, strata_comm* sc) {
    auto dup = Of(sc).Dup("gather");
    if (rank == 0) {
      EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument) << dup.status();
      EXPECT_THAT(
          std::string(dup.status().message()),
          HasSubstr("dup of 'world' into 'gather' returned rank 0 of 3; a dup has the same ranks (rank 0 of 2)"));
    }
    // rank 1's dup succeeds, its start-up all-gather then waits for rank 0, which never comes: both end
  });
}

TEST(ForeignComm, AbortSendsTheNoticeAndCallsTheTrainersAbort) {
  auto job = std::make_shared<ForeignJobState>();
  RunForeignRanks(2, 600000, job, [&](int rank, strata_comm* sc) {
    device::HostDevice dev;
    auto stream = dev.CreateStream("s");
    ASSERT_TRUE(stream.ok());
    if (rank == 0) {
      EXPECT_STRATA_OK(strata_comm_abort(sc, "planted abort"));
      EXPECT_EQ(Of(sc).Barrier(**stream).Wait().code(), absl::StatusCode::kAborted);
      return;
    }
    const absl::Status s = Of(sc).Barrier(**stream).Wait();
    EXPECT_TRUE(comm::IsPeerFailure(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("planted abort"));
  });
  EXPECT_EQ(job->aborts.load(), 1);
  EXPECT_EQ(job->last_abort, "planted abort");
}

// The struct's checks, each on one rank alone (they fail before any collective). Strata owns `user` from the
// call on, so it destroys it on these failures; a header it cannot read is not its, and is left alone.
TEST(ForeignComm, CreateChecksTheStruct) {
  auto job = std::make_shared<ForeignJobState>();
  auto group = comm::CreateInProcessGroup(1, comm::Options{});
  auto make = [&] {
    auto user = std::make_unique<ForeignUser>();
    user->job = job;
    user->comm = std::move(*group[0]->Dup("t"));
    return MakeForeign(std::move(user));
  };
  strata_comm* out = nullptr;
  strata_foreign_comm c = make();
  c.split = nullptr;
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 0, &out), STRATA_ERR_INVALID_ARGUMENT,
                      "foreign has no split callback (NULL)");
  EXPECT_EQ(out, nullptr);
  c = make();
  c.kv_get = nullptr;
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 0, &out), STRATA_ERR_INVALID_ARGUMENT,
                      "sets one of kv_set and kv_get");
  c = make();
  c.rank = 1;
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 0, &out), STRATA_ERR_INVALID_ARGUMENT,
                      "says rank 1 of size 1; a rank is in [0, size)");
  c = make();
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 0, nullptr), STRATA_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_EQ(job->destroyed.load(), 4);
  c = make();
  c.version = 0;
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 0, &out), STRATA_ERR_VERSION, "STRATA_*_INIT");
  EXPECT_EQ(job->destroyed.load(), 4) << "an unreadable struct is not destroyed";
  ForeignDestroy(c.user);
  EXPECT_STRATA_ERROR(strata_comm_create_foreign(nullptr, 0, &out), STRATA_ERR_INVALID_ARGUMENT, "foreign is NULL");
  c = make();  // and a good one, at world size 1
  ASSERT_STRATA_OK(strata_comm_create_foreign(&c, 0, &out));
  int32_t rank = -1, size = -1;
  EXPECT_STRATA_OK(strata_comm_rank(out, &rank));
  EXPECT_STRATA_OK(strata_comm_size(out, &size));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  EXPECT_STRATA_OK(strata_comm_destroy(out));
  EXPECT_EQ(job->destroyed.load(), job->made.load());
}

// Two ranks that claim the same rank: the start-up all-gather finds it on every rank.
TEST(ForeignComm, RanksThatAreNotTheTrainersAreRefusedAtCreate) {
  auto job = std::make_shared<ForeignJobState>();
  auto group = comm::CreateInProcessGroup(2, comm::Options{});
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto user = std::make_unique<ForeignUser>();
      user->job = job;
      user->comm = std::move(*group[r]->Dup("t"));
      strata_foreign_comm c = MakeForeign(std::move(user));
      c.rank = 0;  // both say 0 (rank 1's collectives still run as rank 1 underneath)
      strata_comm* out = nullptr;
      EXPECT_STRATA_ERROR(strata_comm_create_foreign(&c, 5000, &out), STRATA_ERR_INVALID_ARGUMENT,
                          "is not what its ranks say: rank 1 reported world rank 0");
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(job->destroyed.load(), 2);
}

}  // namespace
}  // namespace strata::capi_test
