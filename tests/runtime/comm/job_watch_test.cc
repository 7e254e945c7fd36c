// The job watch (Note [Job watch]): a process that starts it and then dies (SIGKILL, a non-zero exit status, an exit
// that skips the exit handlers) has its death posted under the job's failure key of a stand-in of torchrun's store,
// naming its rank, pid and cause; a process that exits 0 posts nothing; the first notice of a job wins; a watching
// process sees a peer's notice through JobFailure() and, still alive 2 s later, is ended with status 1.
#include "runtime/comm/job_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/tcp_store.h"
#include "tests/runtime/comm/fake_tcp_store.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using Clock = std::chrono::steady_clock;

TorchrunEnv Env(int rank, int world, int port, const std::string& run_id) {
  const std::string r = std::to_string(rank);
  absl::StatusOr<TorchrunEnv> e =
      ParseTorchrunEnv({r, std::to_string(world), r, "127.0.0.1", std::to_string(port), std::nullopt, run_id});
  EXPECT_TRUE(e.ok()) << e.status();
  return *e;
}

// A process (a rank's stand-in) that starts the watch for `env`, then does `then`; its pid. Exit status 99: the
// watch did not start.
pid_t Rank(const TorchrunEnv& env, const std::function<void()>& then) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!WatchTorchrunJob(env).ok()) ::_exit(99);
    then();
    ::_exit(0);
  }
  return pid;
}

// The job's failure notice once it appears within 10 s, else "" (the rank's zombie is reaped only afterwards, so
// the watch's child reads its exit status).
std::string Notice(int port, const std::string& run_id, int wait_ms = 10000) {
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return "";
  const std::string key = "strata/job/" + run_id + "/0/failed";
  const auto until = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (Clock::now() < until) {
    auto here = store->Check(key, Clock::now() + std::chrono::seconds(5));
    if (here.ok() && *here) return *store->Get(key, Clock::now() + std::chrono::seconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

int Reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(JobWatch, ARankKilledBySigkillIsNamedWithItsSignal) {
  FakeTcpStore store;
  const pid_t pid = Rank(Env(1, 2, store.port(), "kill"), [] { ::raise(SIGKILL); });
  const std::string notice = Notice(store.port(), "kill");
  EXPECT_EQ(notice, "1\nrank 1 of 2 (LOCAL_RANK 1, pid " + std::to_string(pid) + " on " +
                        notice.substr(notice.find(" on ") + 4, notice.find(") died") - notice.find(" on ") - 4) +
                        ") died: killed by signal 9 (SIGKILL)");
  EXPECT_TRUE(WIFSIGNALED(Reap(pid)));
}

TEST(JobWatch, ANonZeroExitIsNamedWithItsStatusAndTheFirstNoticeWins) {
  FakeTcpStore store;
  const pid_t first = Rank(Env(1, 3, store.port(), "exit"), [] { std::exit(3); });
  EXPECT_THAT(Notice(store.port(), "exit"), HasSubstr("rank 1 of 3 (LOCAL_RANK 1, pid "));
  const pid_t second = Rank(Env(2, 3, store.port(), "exit"), [] { ::raise(SIGKILL); });
  EXPECT_TRUE(WIFSIGNALED(Reap(second)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the second notice, if any, would be posted by now
  EXPECT_THAT(Notice(store.port(), "exit"), MatchesRegex("1\nrank 1 of 3 .* died: exited with status 3"));
  EXPECT_EQ(WEXITSTATUS(Reap(first)), 3);
}

TEST(JobWatch, ACleanExitPostsNothing) {
  FakeTcpStore store;
  const pid_t exits = Rank(Env(1, 2, store.port(), "clean"), [] { std::exit(0); });
  const pid_t quits = Rank(Env(1, 2, store.port(), "quick"), [] { ::_exit(0); });
  EXPECT_EQ(Notice(store.port(), "clean", 1500), "");
  EXPECT_EQ(Notice(store.port(), "quick", 500), "");
  EXPECT_EQ(WEXITSTATUS(Reap(exits)), 0);
  EXPECT_EQ(WEXITSTATUS(Reap(quits)), 0);
}

TEST(JobWatch, APeerSeesTheNoticeAndIsEndedTwoSecondsLater) {
  FakeTcpStore store;
  const pid_t dead = Rank(Env(1, 2, store.port(), "peer"), [] { ::raise(SIGKILL); });
  // Rank 0 waits for JobFailure() as a communicator's wait polls it, reports it on stdout's stand-in (its exit
  // status: 42 when the notice names rank 1), then sleeps: the watch ends it with status 1.
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t peer = Rank(Env(0, 2, store.port(), "peer"), [&] {
    ::close(out[0]);
    for (int i = 0; i < 500; ++i) {
      if (std::optional<JobDeath> d = JobFailure()) {
        const char word = d->rank == 1 && d->notice.find("killed by signal 9") != std::string::npos ? 'y' : 'n';
        static_cast<void>(::write(out[1], &word, 1));
        std::this_thread::sleep_for(std::chrono::seconds(60));
        ::_exit(0);  // not reached: the watch ends the process first
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::_exit(7);  // no notice within 10 s
  });
  ::close(out[1]);
  char word = 0;
  EXPECT_EQ(::read(out[0], &word, 1), 1);
  EXPECT_EQ(word, 'y');
  ::close(out[0]);
  const int status = Reap(peer);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_TRUE(WIFSIGNALED(Reap(dead)));
}

// Whether the running kernel keeps a collected process's exit status for its pidfds (Linux 6.15).
bool KernelKeepsExitStatus() {
  utsname u{};
  int major = 0;
  int minor = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 15);
}

// EndedStatus of a child that ends by `end`, read while it is a zombie, then after this process (its parent, as
// torchrun's agent is a rank's) has collected it: the agent may collect a rank before the watch's child reads it.
void ExpectStatusBeforeAndAfterCollection(void (*end)(), int expected) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    end();
    ::_exit(0);
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  ASSERT_GE(pidfd, 0);
  pollfd pfd{pidfd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  EXPECT_EQ(EndedStatus(pidfd, pid), expected) << "a zombie";
  EXPECT_EQ(Reap(pid), expected);
  EXPECT_EQ(EndedStatus(pidfd, pid), KernelKeepsExitStatus() ? expected : -1) << "collected";
  ::close(pidfd);
}

TEST(EndedStatus, IsReadFromTheZombieAndStillKnownOnceCollected) {
  ExpectStatusBeforeAndAfterCollection([] { ::raise(SIGKILL); }, SIGKILL);
  ExpectStatusBeforeAndAfterCollection([] { ::_exit(3); }, 3 << 8);
  ExpectStatusBeforeAndAfterCollection([] { ::raise(SIGTERM); }, SIGTERM);
}

TEST(DeathNotice, NamesTheCauseOrNothingForACleanExit) {
  const TorchrunEnv env = Env(3, 8, 1, "x");
  EXPECT_EQ(DeathNotice(env, 77, "h", 0, false), std::nullopt);
  EXPECT_EQ(DeathNotice(env, 77, "h", -1, true), std::nullopt);
  EXPECT_EQ(*DeathNotice(env, 77, "h", 3 << 8, true),
            "rank 3 of 8 (LOCAL_RANK 3, pid 77 on h) died: exited with status 3");
  EXPECT_EQ(*DeathNotice(env, 77, "h", SIGSEGV, false),
            "rank 3 of 8 (LOCAL_RANK 3, pid 77 on h) died: killed by signal 11 (SIGSEGV)");
  EXPECT_THAT(*DeathNotice(env, 77, "h", -1, false), HasSubstr("died: it ended without running its exit handlers"));
}

}  // namespace
}  // namespace strata::comm
