// RunAndCapture (tools/bench/subprocess.h): a normal child's output with and without a deadline; a child
// (or a grandchild holding its stdout) that outlives a short deadline is ended with its whole process
// group, reaped, and reported by command line and timeout; one that ignores SIGTERM gets SIGKILL; without
// a deadline the child stays in our process group as before; a signal sent to us while a child with a
// deadline runs reaches the child's group and then ends us as it would have.
//
// The test process is a child subreaper (PR_SET_CHILD_SUBREAPER), so the grandchildren the commands
// start are re-parented to it when their parent dies: it can then wait for them and prove they are gone
// (PID 1 of a container may never reap them).
#include "tools/bench/subprocess.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata::tools {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

class RunAndCaptureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
};

// Waits (up to 10 s) for the re-parented process `pid` to end; true with its wait status when it did.
bool Reaped(pid_t pid, int* status) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < give_up) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0) return false;  // not our child: it was never re-parented here
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

bool GroupGone(pid_t pgid) { return ::kill(-pgid, 0) != 0 && errno == ESRCH; }

// The deadline of the runs below that are killed: long enough that the shell has set its trap (where it sets
// one), started its background sleep and echoed both pids before it, on a loaded machine too. Output that holds
// the pids proves it: the kill then finds the group in the state each test sets up.
constexpr milliseconds kKillDeadline(2000);

// "<leader> <grandchild>" from the start of the output a failed run reports.
void PidsFrom(const std::string& message, pid_t* leader, pid_t* grandchild) {
  const size_t at = message.find("output so far: ");
  ASSERT_NE(at, std::string::npos) << message;
  std::istringstream in(message.substr(at + 15));
  in >> *leader >> *grandchild;
  ASSERT_GT(*leader, 0) << message;
  ASSERT_GT(*grandchild, 0) << message;
}

TEST_F(RunAndCaptureTest, ReturnsTheOutputWithAndWithoutADeadline) {
  const std::vector<std::string> argv = {"sh", "-c", "echo hello; echo world"};
  auto plain = RunAndCapture(argv);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, "hello\nworld\n");
  auto timed = RunAndCapture(argv, milliseconds(20000));
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(*timed, "hello\nworld\n");
  // More than a pipe's buffer: the deadline loop drains while the child writes.
  auto big = RunAndCapture({"sh", "-c", "head -c 1000000 /dev/zero"}, milliseconds(20000));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->size(), 1000000u);
}

TEST_F(RunAndCaptureTest, UnderADeadlineTheChildReadsNothingFromOurStdin) {
  // Our stdin: a pipe nobody writes to, so a child that inherited it would block in `cat` until the
  // deadline. Under a deadline it reads /dev/null: end of input at once.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int saved = dup(STDIN_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(dup2(fds[0], STDIN_FILENO), STDIN_FILENO);
  auto r = RunAndCapture({"sh", "-c", "cat; echo done"}, milliseconds(3000));
  dup2(saved, STDIN_FILENO);
  close(saved);
  close(fds[0]);
  close(fds[1]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "done\n");
}

TEST_F(RunAndCaptureTest, ExitStatusAndSpawnFailureAsBeforeUnderADeadline) {
  auto failed = RunAndCapture({"sh", "-c", "echo partial; exit 3"}, milliseconds(20000));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed.status().message(), HasSubstr("exited with status 3"));
  EXPECT_THAT(failed.status().message(), HasSubstr("partial"));
  auto missing = RunAndCapture({"/nonexistent/strata-child"}, milliseconds(20000));
  EXPECT_THAT(missing.status().message(), HasSubstr("posix_spawnp(/nonexistent/strata-child)"));
  EXPECT_EQ(RunAndCapture({"true"}, milliseconds(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RunAndCaptureTest, WithoutADeadlineTheChildStaysInOurProcessGroup) {
  auto out = RunAndCapture({"sh", "-c", "cut -d' ' -f5 /proc/$$/stat"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::stoi(*out), getpgrp());
  auto own = RunAndCapture({"sh", "-c", "echo $$; cut -d' ' -f5 /proc/$$/stat"}, milliseconds(20000));
  ASSERT_TRUE(own.ok()) << own.status();
  std::istringstream in(*own);
  int pid = 0, pgid = 0;
  in >> pid >> pgid;
  EXPECT_EQ(pgid, pid) << "with a deadline the child leads its own group";
}

TEST_F(RunAndCaptureTest, PastTheDeadlineTheWholeGroupIsEndedAndReaped) {
  const std::string script = "sleep 30 & echo $$ $!; wait";
  const auto start = std::chrono::steady_clock::now();
  auto r = RunAndCapture({"sh", "-c", script}, kKillDeadline);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("'sh -c " + script + "' did not finish within 2 s (timeout)"));
  EXPECT_LT(seconds, 10) << "a deadline of 2 s and a SIGTERM the shell obeys";
  pid_t leader = 0, grandchild = 0;
  PidsFrom(std::string(r.status().message()), &leader, &grandchild);
  EXPECT_EQ(waitpid(leader, nullptr, WNOHANG), -1) << "the child was reaped (no zombie)";
  int status = 0;
  ASSERT_TRUE(Reaped(grandchild, &status)) << "the grandchild (sleep 30) outlived the group kill";
  EXPECT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_TRUE(GroupGone(leader));
}

TEST_F(RunAndCaptureTest, AGroupThatIgnoresSigtermGetsSigkill) {
  auto r = RunAndCapture({"sh", "-c", "trap '' TERM; sleep 30 & echo $$ $!; wait"}, kKillDeadline);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  pid_t leader = 0, grandchild = 0;
  PidsFrom(std::string(r.status().message()), &leader, &grandchild);
  int status = 0;
  ASSERT_TRUE(Reaped(grandchild, &status));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_TRUE(GroupGone(leader));
}

TEST_F(RunAndCaptureTest, AChildThatClosesItsOutputButRunsOnIsStillEnded) {
  auto r = RunAndCapture({"sh", "-c", "sleep 30 > /dev/null & echo $$ $!; exec 1>&-; wait"}, kKillDeadline);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  pid_t leader = 0, grandchild = 0;
  PidsFrom(std::string(r.status().message()), &leader, &grandchild);
  EXPECT_EQ(waitpid(leader, nullptr, WNOHANG), -1) << "the child was reaped (no zombie)";
  int status = 0;
  ASSERT_TRUE(Reaped(grandchild, &status));
  EXPECT_TRUE(GroupGone(leader));
}

TEST_F(RunAndCaptureTest, AGrandchildHoldingTheOutputAfterTheChildExitsIsEnded) {
  // The shell exits at once; its background sleep keeps stdout open (without a deadline: 30 s).
  auto r = RunAndCapture({"sh", "-c", "sleep 30 & echo $$ $!"}, kKillDeadline);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  pid_t leader = 0, grandchild = 0;
  PidsFrom(std::string(r.status().message()), &leader, &grandchild);
  int status = 0;
  ASSERT_TRUE(Reaped(grandchild, &status));
  EXPECT_TRUE(WIFSIGNALED(status)) << status;
}

TEST_F(RunAndCaptureTest, ASignalToUsReachesTheChildGroupThenEndsUs) {
  // The child sends SIGTERM to its parent (the death-test process) as it starts: the parent forwards it
  // to the child's group, reaps the child, and is then ended by SIGTERM itself.
  char path[] = "/tmp/strata_subprocess_testXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string script = std::string("sleep 30 & echo $! > ") + path + "; kill -TERM $PPID; wait";
  EXPECT_EXIT((void)RunAndCapture({"sh", "-c", script}, milliseconds(60000)), ::testing::KilledBySignal(SIGTERM), "");
  pid_t grandchild = 0;
  std::ifstream(path) >> grandchild;
  std::remove(path);
  ASSERT_GT(grandchild, 0);
  int status = 0;
  ASSERT_TRUE(Reaped(grandchild, &status)) << "the forwarded SIGTERM did not reach the grandchild";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
}

}  // namespace
}  // namespace strata::tools
