#include "runtime/comm/job_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/tcp_store.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWatchPollMs = 100;
constexpr int kEndAfterMs = 2000;

// Leaked on purpose: the watcher thread may still read them while the process exits.
std::mutex& Mu() {
  static std::mutex* const mu = new std::mutex();
  return *mu;
}
std::optional<JobDeath>& Notice() {
  static auto* const notice = new std::optional<JobDeath>();
  return *notice;
}
bool started = false;    // guarded by Mu()
pid_t watched_pid = 0;   // the process whose exit handler tells the child it ended cleanly
int clean_word_fd = -1;  // the write end of the pipe to the child

std::string Prefix(const TorchrunEnv& env) {
  return absl::StrCat("strata/job/", env.run_id, "/", env.restart_count, "/");
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return nullptr;
  }
}

// The exit status of `pid`, as waitpid reports it, from field 52 of /proc/<pid>/stat while it is a zombie (its
// parent, torchrun's agent, has not collected it yet); -1 when it is gone.
int ZombieStatus(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // field 2, the name, may hold spaces
  // Field 3, the state: a zombie's is Z. Anything else is another process that took the pid after the agent
  // collected this one (its 0 would read as a clean exit).
  if (p == nullptr || p[1] != ' ' || p[2] != 'Z') return -1;
  int field = 2;
  for (; *p != '\0' && field < 52; ++p) {
    if (*p == ' ') ++field;
  }
  if (field != 52) return -1;
  char* end = nullptr;
  const long status = std::strtol(p, &end, 10);
  if (end == p) return -1;
  return static_cast<int>(status);
}

// The first published layout of the kernel's struct pidfd_info (PIDFD_INFO_SIZE_VER0, Linux 6.13; the exit status
// since 6.15), declared here because Debian 12's headers predate it. The kernel fills as much as the size says.
struct PidfdInfoV0 {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfoV0) == 64);
constexpr uint64_t kPidfdInfoExit = 1u << 3;                           // PIDFD_INFO_EXIT
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfoV0);  // PIDFD_GET_INFO

// The exit status the kernel keeps for a collected process (Linux 6.15): it is there once the pidfd reports
// POLLHUP (the process was reaped), which follows the zombie's end within the reaper's own call. -1 on an older
// kernel, or when no HUP comes within 1 s.
int CollectedStatus(int pidfd) {
  pollfd pfd{pidfd, POLLIN, 0};
  const auto until = Clock::now() + std::chrono::seconds(1);
  while ((pfd.revents & POLLHUP) == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return -1;
    pfd.revents = 0;
    if (::poll(&pfd, 1, static_cast<int>(left)) < 0 && errno != EINTR) return -1;
    if ((pfd.revents & POLLHUP) == 0 && pfd.revents != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // ended, not yet reaped: POLLIN stays up
    }
  }
  PidfdInfoV0 info{};
  info.mask = kPidfdInfoExit;
  if (::ioctl(pidfd, kPidfdGetInfo, &info) != 0 || (info.mask & kPidfdInfoExit) == 0) return -1;
  return info.exit_code;
}

}  // namespace

int EndedStatus(int pidfd, int pid) {
  const int zombie = ZombieStatus(pid);
  return zombie >= 0 ? zombie : CollectedStatus(pidfd);
}

namespace {

// The death notice's child (Note [Job watch]). Runs after fork(): only this function, then _exit.
[[noreturn]] void NoticeChild(const TorchrunEnv& env, int pid, const std::string& host, TcpStoreClient& store,
                              int pidfd, int word_fd) {
  ::prctl(PR_SET_NAME, "strata-watch");
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);  // torchrun's agent stops the group
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3 && null >= 0; ++fd) ::dup2(null, fd);
  // Every other inherited descriptor goes: a dead rank's sockets must close at its death, not at this child's.
  std::array<int, 3> keep = {store.fd(), pidfd, word_fd};
  std::sort(keep.begin(), keep.end());
  unsigned from = 3;
  for (int k : keep) {
    if (static_cast<unsigned>(k) > from) ::syscall(SYS_close_range, from, static_cast<unsigned>(k) - 1, 0u);
    from = static_cast<unsigned>(k) + 1;
  }
  ::syscall(SYS_close_range, from, ~0u, 0u);
  pollfd pfd{pidfd, POLLIN, 0};
  while (::poll(&pfd, 1, -1) < 0) {
    if (errno != EINTR) ::_exit(0);  // nothing to watch with
  }
  const int status = EndedStatus(pidfd, pid);
  char word = 0;
  const bool clean = ::read(word_fd, &word, 1) == 1 && word == 'q';
  const std::optional<std::string> notice = DeathNotice(env, pid, host, status, clean);
  if (notice.has_value()) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    absl::StatusOr<int64_t> first = store.Add(Prefix(env) + "claim", 1, deadline);
    if (first.ok() && *first == 1) {
      static_cast<void>(store.Set(Prefix(env) + "failed", absl::StrCat(env.rank, "\n", *notice), deadline));
    }
  }
  ::_exit(0);
}

void TellCleanExit() {
  if (::getpid() != watched_pid || clean_word_fd < 0) return;  // a forked child (a data loader's) is not the rank
  const char q = 'q';
  static_cast<void>(::write(clean_word_fd, &q, 1));
}

void WatchLoop(TorchrunEnv env, TcpStoreClient store) {
  const std::string key = Prefix(env) + "failed";
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kWatchPollMs));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    absl::StatusOr<bool> here = store.Check(key, deadline);
    if (!here.ok()) return;  // the store is gone (the job is ending): nothing more to watch
    if (!*here) continue;
    absl::StatusOr<std::string> got = store.Get(key, deadline);
    if (!got.ok()) return;
    const size_t nl = got->find('\n');
    JobDeath death;
    death.notice = nl == std::string::npos ? *got : got->substr(nl + 1);
    if (nl == std::string::npos || !absl::SimpleAtoi(got->substr(0, nl), &death.rank)) death.rank = -1;
    const std::string why = death.notice;
    {
      std::lock_guard<std::mutex> lock(Mu());
      Notice() = std::move(death);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kEndAfterMs));
    std::fprintf(stderr,
                 "strata: ending rank %d of %d: a rank of the job died, and this one had not ended %d ms "
                 "later: %s\n",
                 env.rank, env.world_size, kEndAfterMs, why.c_str());
    std::fflush(stderr);
    ::_exit(1);
  }
}

}  // namespace

std::optional<std::string> DeathNotice(const TorchrunEnv& env, int pid, const std::string& host, int status,
                                       bool clean_exit) {
  const std::string who = absl::StrCat("rank ", env.rank, " of ", env.world_size, " (LOCAL_RANK ", env.local_rank,
                                       ", pid ", pid, " on ", host, ") died: ");
  if (status < 0) {
    if (clean_exit) return std::nullopt;
    return who +
           "it ended without running its exit handlers (killed or crashed; its exit status was collected before "
           "it could be read, and the pidfd did not give it: Linux 6.15 or later keeps it)";
  }
  if (WIFSIGNALED(status)) {
    const char* name = SignalName(WTERMSIG(status));
    return absl::StrCat(who, "killed by signal ", WTERMSIG(status), name ? absl::StrCat(" (", name, ")") : "");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return absl::StrCat(who, "exited with status ", WEXITSTATUS(status));
  return std::nullopt;
}

void WatchTorchrunJobOrWarn(const TorchrunEnv& env) {
  if (absl::Status watch = WatchTorchrunJob(env); !watch.ok()) {
    STRATA_LOG(Warning) << "no failure notices across torchrun's nodes: " << watch.message();
  }
}

std::optional<JobDeath> JobFailure() {
  std::lock_guard<std::mutex> lock(Mu());
  return Notice();
}

absl::Status WatchTorchrunJob(const TorchrunEnv& env) {
  std::lock_guard<std::mutex> lock(Mu());
  if (started || env.world_size == 1) return absl::OkStatus();
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  STRATA_ASSIGN_OR_RETURN(TcpStoreClient child_store,
                          TcpStoreClient::Connect(env.master_addr, env.master_port, deadline));
  STRATA_ASSIGN_OR_RETURN(TcpStoreClient watch_store,
                          TcpStoreClient::Connect(env.master_addr, env.master_port, deadline));
  const pid_t pid = ::getpid();
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return ErrnoError("pidfd_open (Linux 5.3 or later) for the job watch", errno, __FILE__, __LINE__);
  int word[2];
  if (::pipe2(word, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(pidfd);
    return ErrnoError("pipe2 for the job watch", e, __FILE__, __LINE__);
  }
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const pid_t child = ::fork();
  if (child == 0) NoticeChild(env, pid, host, child_store, pidfd, word[0]);
  const int fork_errno = errno;
  ::close(pidfd);
  ::close(word[0]);
  if (child < 0) {
    ::close(word[1]);
    return ErrnoError("fork of the job watch's death notice", fork_errno, __FILE__, __LINE__);
  }
  watched_pid = pid;
  clean_word_fd = word[1];
  std::atexit(TellCleanExit);
  std::thread(WatchLoop, env, std::move(watch_store)).detach();
  started = true;
  return absl::OkStatus();
}

}  // namespace strata::comm
