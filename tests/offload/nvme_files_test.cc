// Note [Swap files leave nothing behind]: an open file set has no names in its directories (the space is
// held by the descriptors, so the kernel frees it however the process ends); keep_files keeps the names,
// locked, and nothing else removes them while their process lives; a dead run's names, and an older
// release's, are reclaimed by the next Open, which names them.
#include "runtime/offload/nvme_files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::offload {
namespace {

namespace fs = std::filesystem;

class NvmeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("nvme_files_test." + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::set<std::string> Names() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
    return names;
  }
  NvmeFileSetOptions Options(const std::string& name, bool keep = false) const {
    NvmeFileSetOptions o;
    o.paths = {dir_.string()};
    o.name = name;
    o.capacity_bytes = 1 << 20;
    o.direct_io = DirectIo::kOff;
    o.keep_files = keep;
    return o;
  }
  // A file with `bytes` allocated, as a dead run leaves it (unlocked).
  std::string Leftover(const std::string& name, off_t bytes) const {
    const std::string path = (dir_ / name).string();
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << path;
    EXPECT_EQ(fallocate(fd, 0, 0, bytes), 0);
    close(fd);
    return path;
  }

  // The pid of a process that has ended (forked, exited and reaped): what a killed run's name carries.
  static pid_t DeadPid() {
    const pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    return child;
  }

  fs::path dir_;
};

TEST_F(NvmeFilesTest, AnOpenSetHasNoNamesAndItsFilesWork) {
  auto set = NvmeFileSet::Open(Options("swap"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_THAT(Names(), ::testing::IsEmpty()) << "the space is held by the descriptor alone";
  struct stat st;
  ASSERT_EQ(fstat((*set)->fd(0), &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), uint64_t{1} << 20);
  const char text[] = "written and read back";
  ASSERT_EQ(pwrite((*set)->fd(0), text, sizeof(text), 4096), static_cast<ssize_t>(sizeof(text)));
  char back[sizeof(text)] = {};
  ASSERT_EQ(pread((*set)->fd(0), back, sizeof(back), 4096), static_cast<ssize_t>(sizeof(back)));
  EXPECT_STREQ(back, text);
}

// A child process opens a set and is killed with SIGKILL (no destructor runs): nothing is left behind.
TEST_F(NvmeFilesTest, SigkillLeavesNothingBehind) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto set = NvmeFileSet::Open(Options("swap"));
    if (!set.ok()) _exit(3);
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

TEST_F(NvmeFilesTest, KeepFilesKeepsLockedNamesThatAnotherOpenLeavesAlone) {
  std::string kept;
  {
    auto set = NvmeFileSet::Open(Options("debug", /*keep=*/true));
    ASSERT_TRUE(set.ok()) << set.status();
    kept = (*set)->path(0);
    EXPECT_THAT(Names(), ::testing::ElementsAre(fs::path(kept).filename().string()));
    EXPECT_THAT(kept, ::testing::HasSubstr("strata-debug-r0.0." + std::to_string(getpid()) + ".swap"));
    // Another store opening in the same directory (another run, or this one) must not take it for a
    // dead run's file: it is locked.
    auto other = NvmeFileSet::Open(Options("swap"));
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(ReclaimStaleSwapFiles(dir_.string()), 0u);
    EXPECT_TRUE(fs::exists(kept));
  }
  EXPECT_TRUE(fs::exists(kept)) << "keep_files: the name outlives the set";
}

TEST_F(NvmeFilesTest, OpenReclaimsADeadRunsFilesAndNamesThem) {
  const std::string old_release = Leftover("strata-swap-r0.0.swap", 1 << 20);  // before names were unlinked
  const std::string killed = Leftover("strata-param-r3.1." + std::to_string(DeadPid()) + ".swap", 1 << 16);
  const std::string unrelated = Leftover("strata-notes.txt", 4096);
  const std::string other_kind = Leftover("mydata.swap", 4096);
  fs::create_symlink(unrelated, dir_ / "strata-link.swap");
  ::testing::internal::CaptureStderr();
  auto set = NvmeFileSet::Open(Options("swap"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_FALSE(fs::exists(old_release));
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_THAT(log, ::testing::HasSubstr("reclaimed '" + old_release + "'"));
  EXPECT_THAT(log, ::testing::HasSubstr("reclaimed '" + killed + "'"));
  EXPECT_THAT(log, ::testing::HasSubstr("1.00 MiB"));
  EXPECT_TRUE(fs::exists(unrelated)) << "not a swap file's name";
  EXPECT_TRUE(fs::exists(other_kind)) << "not Strata's";
  EXPECT_TRUE(fs::is_symlink(dir_ / "strata-link.swap")) << "a symbolic link is never followed nor removed";
}

// A live process holding its file locked (another run between its create and its unlink, or with
// keep_files) keeps it; once that process is gone the file is reclaimed.
TEST_F(NvmeFilesTest, ALiveRunsLockedFileIsKeptUntilItDies) {
  const std::string prefix = (dir_ / "strata-swap-r1.0.").string();
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  const std::string path = prefix + std::to_string(child == 0 ? getpid() : child) + ".swap";
  if (child == 0) {
    close(ready[0]);
    close(release[1]);  // else its own copy keeps the pipe open and the read below never ends
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(3);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(4);
    if (read(release[0], &c, 1) < 0) _exit(5);  // returns when the parent closes its end
    _exit(0);
  }
  close(ready[1]);
  close(release[0]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(ReclaimStaleSwapFiles(dir_.string()), 0u);
  EXPECT_TRUE(fs::exists(path)) << "locked by a live process";
  close(release[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ReclaimStaleSwapFiles(dir_.string());
  EXPECT_FALSE(fs::exists(path)) << "its process is gone, and its lock with it";
  close(ready[0]);
}

// Another rank of a job on this host between its create and its lock: the file is not locked yet, but
// its creator lives, so it is not stale and no warning names it.
TEST_F(NvmeFilesTest, AnUnlockedFileOfALiveProcessIsNotReclaimed) {
  const std::string racing = Leftover("strata-swap-r1.0." + std::to_string(getpid()) + ".swap", 4096);
  const std::string dead = Leftover("strata-swap-r2.0." + std::to_string(DeadPid()) + ".swap", 4096);
  ::testing::internal::CaptureStderr();
  EXPECT_GT(ReclaimStaleSwapFiles(dir_.string()), 0u);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::exists(racing)) << "its creator is alive";
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr(racing)));
  EXPECT_FALSE(fs::exists(dead)) << "its creator is gone";
}

}  // namespace
}  // namespace strata::offload
