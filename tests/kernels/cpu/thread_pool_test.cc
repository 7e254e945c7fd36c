// The fork-join pool: every task runs exactly once per Run, in increasing order per participant, writes
// are visible after Run, workers are pinned where asked, Run calls from several threads serialise, and
// idle / destroyed pools leave nothing behind. Runs under TSan (label tsan).
#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace strata::kernels::cpu {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnceInIncreasingOrderPerParticipant) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(ThreadPool::Options{threads, {}});
    ASSERT_EQ(pool.threads(), threads);
    for (size_t tasks : {size_t{0}, size_t{1}, size_t{2}, size_t{1000}}) {
      std::vector<int> hits(tasks, 0);  // each slot written by one task only
      std::vector<std::vector<size_t>> seen(static_cast<size_t>(threads));
      auto f = [&](size_t t, int p) {
        ++hits[t];
        seen[static_cast<size_t>(p)].push_back(t);
      };
      pool.ParallelFor(tasks, f);
      for (size_t t = 0; t < tasks; ++t) ASSERT_EQ(hits[t], 1) << "threads=" << threads << " task " << t;
      for (const auto& s : seen) {
        for (size_t i = 1; i < s.size(); ++i) ASSERT_LT(s[i - 1], s[i]) << "threads=" << threads;
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackRunsSeeEachOthersWrites) {
  ThreadPool pool(ThreadPool::Options{3, {}});
  std::vector<long> acc(64, 0);
  for (int round = 0; round < 2000; ++round) {
    auto f = [&](size_t t, int) { acc[t] += round; };
    pool.ParallelFor(acc.size(), f);
  }
  for (long a : acc) EXPECT_EQ(a, 1999L * 2000 / 2);
}

TEST(ThreadPool, PinsWorkersToTheGivenCpus) {
  const std::vector<int> cpus = AllowedCpus();
  ASSERT_FALSE(cpus.empty());
  const int threads = cpus.size() >= 2 ? 2 : 1;
  std::vector<int> want = {cpus[0], cpus.back()};
  ThreadPool pool(ThreadPool::Options{threads, want});
  EXPECT_TRUE(pool.pinned());
  std::vector<int> ran_on(static_cast<size_t>(threads), -1);
  std::atomic<int> arrived{0};
  auto f = [&](size_t, int p) {
    ran_on[static_cast<size_t>(p)] = sched_getcpu();
    arrived.fetch_add(1);
    // Hold each task until both participants have one, so the worker really runs a task.
    while (arrived.load() < threads) std::this_thread::yield();
  };
  pool.ParallelFor(static_cast<size_t>(threads), f);
  if (threads == 2) {
    EXPECT_EQ(pool.worker_cpu(1), want[1]);
    EXPECT_EQ(ran_on[1], want[1]) << "worker 1 ran off its CPU";
  }
}

TEST(ThreadPool, ReportsFailedPinningInsteadOfFailing) {
  ThreadPool pool(ThreadPool::Options{2, {0, 1 << 20}});  // no such CPU
  EXPECT_FALSE(pool.pinned());
  EXPECT_EQ(pool.worker_cpu(1), -1);
  std::atomic<int> n{0};
  auto f = [&](size_t, int) { n.fetch_add(1); };
  pool.ParallelFor(10, f);
  EXPECT_EQ(n.load(), 10);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(ThreadPool::Options{2, {}});
  std::atomic<int> inside{0}, max_inside{0};
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int r = 0; r < 200; ++r) {
      auto f = [&](size_t, int) {
        const int now = inside.fetch_add(1) + 1;
        int m = max_inside.load();
        while (now > m && !max_inside.compare_exchange_weak(m, now)) {
        }
        total.fetch_add(1);
        inside.fetch_sub(1);
      };
      pool.ParallelFor(8, f);
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 8);
  EXPECT_LE(max_inside.load(), pool.threads()) << "two Runs overlapped";
}

TEST(ThreadPool, ClampsThreadCountAndDestroysIdleWorkers) {
  { ThreadPool idle(ThreadPool::Options{4, {}}); }  // never run: destructor must wake and join
  ThreadPool zero(ThreadPool::Options{0, {}});
  EXPECT_EQ(zero.threads(), 1);
  ThreadPool huge(ThreadPool::Options{100000, {}});
  EXPECT_EQ(huge.threads(), ThreadPool::kMaxThreads);
}

}  // namespace
}  // namespace strata::kernels::cpu
