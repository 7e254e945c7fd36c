// Tests for runtime/comm/shm_communicator (docs/decisions/0053): the conformance suite at world sizes 1-4
// with each rank a thread that maps the segment itself (the in-process back-end as the bootstrap), also with
// slots small enough that every case takes many rounds; then the failures of Note [Shared-memory rounds]: a
// rank that never arrives is named at the deadline, and a peer that comes late fails at once; a count
// mismatch names the rank; a peer whose process is gone (or a zombie) is named before the deadline; Abort; ranks on
// different hosts are refused, and so is a segment /dev/shm has no room for; and no segment is left in
// /dev/shm. The processes of an mpirun job, and the sums bit for bit against the MPI back-end, are
// shm_mpi_test.cc's.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/comm/in_process.h"
#include "runtime/comm/shm_communicator.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::comm {
namespace {

using conformance::HostArray;
using conformance::RankHarness;
using ::testing::HasSubstr;

Options WithTimeout(int64_t timeout_ms) {
  Options o;
  o.timeout_ms = timeout_ms;
  o.name = "test";
  return o;
}

int64_t MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

using RankBody = std::function<void(int, absl::StatusOr<std::unique_ptr<Communicator>>&, RankHarness*)>;

// Makes a shared-memory communicator per rank, each on its own thread over an in-process bootstrap, with
// `options(rank)` and `config(rank)`, and runs `body` with it (or with the creation's failure) and a stream of
// the rank's own.
void RunShmRanks(int world, const std::function<Options(int)>& options, const std::function<ShmConfig(int)>& config,
                 const RankBody& body) {
  auto boot = CreateInProcessGroup(world, WithTimeout(20000));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateShmCommunicator(*boot[r], options(r), config(r));
      device::HostDevice dev;
      auto stream = dev.CreateStream(absl::StrCat("rank", r));
      ASSERT_TRUE(stream.ok()) << stream.status();
      if (!comm.ok()) {
        body(r, comm, nullptr);
        return;
      }
      RankHarness h{**comm, dev, **stream};
      body(r, comm, &h);
      static_cast<void>((*stream)->Synchronize());  // the error cases leave a failed stream
    });
  }
  for (auto& t : threads) t.join();
}

void RunShmRanks(int world, const Options& options, const std::function<ShmConfig(int)>& config, const RankBody& body) {
  RunShmRanks(
      world, [&](int) { return options; }, config, body);
}

void RunShmRanks(int world, const Options& options, const std::function<void(int, RankHarness&)>& body,
                 size_t slot_bytes = ShmConfig{}.slot_bytes) {
  RunShmRanks(
      world, options, [&](int) { return ShmConfig{.slot_bytes = slot_bytes}; },
      [&](int r, absl::StatusOr<std::unique_ptr<Communicator>>& comm, RankHarness* h) {
        ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
        EXPECT_EQ(h->comm.rank(), r);
        body(r, *h);
      });
}

// ---- The conformance suite ----

class ShmConformance : public ::testing::TestWithParam<std::tuple<size_t, int, size_t>> {};

TEST_P(ShmConformance, Passes) {
  const auto& [index, world, slot_bytes] = GetParam();
  RunShmRanks(
      world, WithTimeout(20000), [&](int, RankHarness& h) { conformance::Cases()[index].body(h); }, slot_bytes);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<size_t, int, size_t>>& info) {
  return absl::StrCat(conformance::Cases()[std::get<0>(info.param)].name, "_World", std::get<1>(info.param), "_Slot",
                      std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllCases, ShmConformance,
                         ::testing::Combine(::testing::Range(size_t{0}, conformance::Cases().size()),
                                            ::testing::Values(1, 2, 3, 4), ::testing::Values(ShmConfig{}.slot_bytes)),
                         CaseName);

// Slots of 4 KiB: every case of more than a few elements takes many rounds, and a reduction's pieces
// (a quarter or a third of a slot) end inside blocks.
INSTANTIATE_TEST_SUITE_P(SmallSlots, ShmConformance,
                         ::testing::Combine(::testing::Range(size_t{0}, conformance::Cases().size()),
                                            ::testing::Values(3, 4), ::testing::Values(size_t{4096})),
                         CaseName);

// ---- Failures ----

// The waits that end by a mechanism long before their deadline (a notice, a dead pid, an abort) have this one.
// Each asserts the message the mechanism gives and that the wait ended before half the deadline; how soon within
// that is latency (about 100 ms for a dead pid, the grace for a notice), which a loaded host can stretch: a bound
// in seconds would fail by luck.
constexpr int64_t kLongDeadlineMs = 60000;

// Rank 2 does not issue the all-reduce: ranks 0 and 1 (which issue it together, however slow their setup) end at
// their deadline naming it, and their later collectives fail at once with the same error. Rank 2 then comes
// late: the round it joins was posted by everyone, but its next collective fails at once with the peers'
// timeout (after a notice's grace), not at its own deadline (a minute).
TEST(ShmFailures, AMissingRankIsNamedAtTheDeadlineAndALateOneFailsAtOnce) {
  constexpr int64_t kTimeoutMs = 500;
  conformance::Gate peers_timed_out;
  std::atomic<int> timed_out{0};
  std::latch set_up(2);
  auto options = [](int rank) { return WithTimeout(rank == 2 ? kLongDeadlineMs : kTimeoutMs); };
  auto config = [](int) { return ShmConfig{}; };
  RunShmRanks(3, options, config, [&](int rank, absl::StatusOr<std::unique_ptr<Communicator>>& comm, RankHarness* p) {
    ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status();
    RankHarness& h = *p;
    HostArray buf(DType::kF32, 8);
    if (rank == 2) {
      ASSERT_TRUE(peers_timed_out.Wait());
      static_cast<void>(h.comm.AllReduce(buf.data(), buf.data(), 8, DType::kF32, ReduceOp::kSum, h.stream).Wait());
      auto again = h.device.CreateStream("again");
      ASSERT_TRUE(again.ok());
      const auto t0 = std::chrono::steady_clock::now();
      const absl::Status s = h.comm.Barrier(**again).Wait();
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
      EXPECT_TRUE(IsPeerFailure(s)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("timed out"));
      EXPECT_LT(MsSince(t0), kLongDeadlineMs / 2) << "the late rank waited for its own deadline";
      return;
    }
    set_up.arrive_and_wait();
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = h.comm.AllReduce(buf.data(), buf.data(), 8, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    const int64_t ms = MsSince(t0);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << rank << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce #0 on 'test' (rank "));
    EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank(s) 2 to join it"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 0,1 arrived"));
    EXPECT_GE(ms, kTimeoutMs - 5);
    EXPECT_LT(ms, kTimeoutMs + 5000);
    auto again = h.device.CreateStream("again");
    ASSERT_TRUE(again.ok());
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_EQ(h.comm.Barrier(**again).Wait(), s) << "a later collective fails at once with the first error";
    EXPECT_LT(MsSince(t1), kTimeoutMs);
    if (++timed_out == 2) peers_timed_out.Open();
  });
}

// Rank 1 passes another count: every rank's collective fails with InvalidArgument naming what each rank
// called, and the communicator goes on working.
TEST(ShmFailures, ACountMismatchNamesTheRankOnEveryRank) {
  RunShmRanks(3, WithTimeout(20000), [&](int rank, RankHarness& h) {
    const size_t count = rank == 1 ? 9 : 8;
    HostArray send(DType::kF32, count), recv(DType::kF32, count);
    const absl::Status s =
        h.comm.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum, h.stream).Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch at all_reduce #0 on 'test'"));
    if (rank != 1) {
      EXPECT_THAT(std::string(s.message()), HasSubstr("but rank 1 called all_reduce #0 (count=9, fp32, sum)")) << s;
    } else {
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 called all_reduce #0 (count=9, fp32, sum) but rank 0 "
                                                      "called all_reduce #0 (count=8, fp32, sum)"))
          << s;
    }
    auto fresh = h.device.CreateStream("fresh");
    ASSERT_TRUE(fresh.ok());
    HostArray a(DType::kF32, 3), b(DType::kF32, 9);
    for (size_t i = 0; i < 3; ++i) a.Set(i, static_cast<float>(rank * 10 + i));
    const absl::Status g = h.comm.AllGather(a.data(), b.data(), 3, DType::kF32, **fresh).Wait();
    EXPECT_TRUE(g.ok()) << "rank " << rank << ": " << g;
    for (size_t i = 0; i < 9; ++i) EXPECT_EQ(b.Get(i), static_cast<double>((i / 3) * 10 + i % 3));
  });
}

// Rank 1 calls the all-gather where its peers call a reduce-scatter of the same count: named too.
TEST(ShmFailures, AnotherCollectiveIsAMismatch) {
  RunShmRanks(2, WithTimeout(20000), [&](int rank, RankHarness& h) {
    HostArray send(DType::kBF16, 8), recv(DType::kBF16, 8);
    const absl::Status s =
        rank == 1 ? h.comm.AllGather(send.data(), recv.data(), 4, DType::kBF16, h.stream).Wait()
                  : h.comm.ReduceScatter(send.data(), recv.data(), 4, DType::kBF16, ReduceOp::kAvg, h.stream).Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(rank == 0 ? "but rank 1 called all_gather #0 (count=4, bf16)"
                                    : "but rank 0 called reduce_scatter #0 (count=4, bf16, avg)"))
        << s;
  });
}

// A process that has ended: its pid, reaped, names nothing alive.
int64_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

// A child that has exited and that this process has not reaped: a zombie, which kill(pid, 0) still finds (as a
// torchrun worker is until the agent next polls it). Reaped when this goes out of scope.
class Zombie {
 public:
  Zombie() : pid_(fork()) {
    if (pid_ == 0) _exit(0);
    siginfo_t info{};
    waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT);  // until it has exited, leaving it unreaped
  }
  ~Zombie() { waitpid(pid_, nullptr, 0); }
  Zombie(const Zombie&) = delete;
  Zombie& operator=(const Zombie&) = delete;
  int64_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// Rank 2 plays a process that has exited (its card carries `pid`) and never issues: its peers, with a deadline of
// a minute, end well before it, naming rank 2's process as gone.
void ExpectAGonePeerNamed(int64_t pid) {
  RunShmRanks(
      3, WithTimeout(kLongDeadlineMs), [&](int r) { return ShmConfig{.pid = r == 2 ? pid : 0}; },
      [&](int rank, absl::StatusOr<std::unique_ptr<Communicator>>& comm, RankHarness* h) {
        ASSERT_TRUE(comm.ok()) << comm.status();
        if (rank == 2) return;
        HostArray send(DType::kF32, 4), recv(DType::kF32, 12);
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status s = h->comm.AllGather(send.data(), recv.data(), 4, DType::kF32, h->stream).Wait();
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        EXPECT_TRUE(IsPeerFailure(s)) << s;
        EXPECT_THAT(
            std::string(s.message()),
            HasSubstr(absl::StrCat("rank 2 failed and will not join it: its process (pid ", pid, ") has exited")));
        EXPECT_LT(MsSince(t0), kLongDeadlineMs / 2);
      });
}

TEST(ShmFailures, APeerWhoseProcessIsGoneIsNamedBeforeTheDeadline) { ExpectAGonePeerNamed(DeadPid()); }

TEST(ShmFailures, APeerWhoseProcessIsAZombieIsNamedBeforeTheDeadline) {
  Zombie zombie;
  ASSERT_EQ(kill(static_cast<pid_t>(zombie.pid()), 0), 0) << "the zombie's pid must still be found";
  ExpectAGonePeerNamed(zombie.pid());
}

// Abort on one rank ends its peers' waits, on the communicator and on one split from it.
TEST(ShmFailures, AbortEndsEveryCommunicatorsWaits) {
  RunShmRanks(3, WithTimeout(kLongDeadlineMs), [&](int rank, RankHarness& h) {
    auto dup = h.comm.Dup("dup");
    ASSERT_TRUE(dup.ok()) << dup.status();
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      h.comm.Abort(absl::InternalError("planted abort"));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = (*dup)->Barrier(h.stream).Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 aborted the job: planted abort"));
    EXPECT_LT(MsSince(t0), kLongDeadlineMs / 2);
  });
}

// Note [Failure notices]: a notice ends the peers' waits after the grace (200 ms, kNoticeGrace: a wait that sees
// it first goes on that long, for a peer that joined the round before it failed), not at the deadline.
TEST(ShmFailures, ANoticeEndsThePeersWaitsAfterTheGrace) {
  RunShmRanks(3, WithTimeout(kLongDeadlineMs), [&](int rank, RankHarness& h) {
    if (rank == 1) {
      h.comm.NotifyFailure(absl::InternalError("planted"));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = h.comm.Barrier(h.stream).Wait();
    EXPECT_TRUE(IsPeerFailure(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 failed and will not join it: planted"));
    EXPECT_GE(MsSince(t0), 200);
    EXPECT_LT(MsSince(t0), kLongDeadlineMs / 2);
  });
}

TEST(ShmFailures, RanksOnDifferentHostsAreRefused) {
  RunShmRanks(
      3, WithTimeout(20000), [](int r) { return ShmConfig{.host_id = r == 2 ? "hostB" : "hostA"}; },
      [](int rank, absl::StatusOr<std::unique_ptr<Communicator>>& comm, RankHarness*) {
        EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << "rank " << rank;
        EXPECT_THAT(std::string(comm.status().message()),
                    HasSubstr("needs every rank on one host, but rank(s) 0,1 on 'hostA', rank(s) 2 on 'hostB'"));
      });
}

// Rank 0 cannot back the segment (slots of 1 TiB: /dev/shm refuses the space at once): every rank fails alike,
// naming rank 0 and /dev/shm, and nothing is left there.
TEST(ShmFailures, ASegmentThatCannotBeMadeFailsEveryRankNamingIt) {
  RunShmRanks(
      3, WithTimeout(20000), [](int) { return ShmConfig{.slot_bytes = size_t{1} << 40}; },
      [](int rank, absl::StatusOr<std::unique_ptr<Communicator>>& comm, RankHarness*) {
        EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << "rank " << rank;
        EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 0: cannot size the shared segment"));
        EXPECT_THAT(std::string(comm.status().message()), HasSubstr("in /dev/shm"));
      });
}

// This process's segments in /dev/shm (RandomSegmentName: "strata-<pid>-...").
int SegmentsInDevShm() {
  const std::string prefix = absl::StrCat("strata-", getpid(), "-");
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
  closedir(d);
  return n;
}

// The names are unlinked once every rank mapped them, before the first collective: a job that dies
// leaves nothing in /dev/shm.
TEST(ShmSegments, NoneIsLeftNamedOnceMade) {
  RunShmRanks(3, WithTimeout(20000), [&](int rank, RankHarness& h) {
    auto split = h.comm.Split(rank % 2, 0, "split");
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_TRUE(h.comm.Barrier(h.stream).Wait().ok());
    EXPECT_EQ(SegmentsInDevShm(), 0);
  });
}

}  // namespace
}  // namespace strata::comm
