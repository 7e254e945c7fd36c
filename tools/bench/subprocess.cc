// posix_spawnp with a pipe on stdout. The parent closes its copy of the write end before reading, so
// end of file arrives when the child (and anything it spawned that kept the pipe) has exited; the child
// gets no other descriptors of ours beyond what is not close-on-exec. With a deadline the child leads a
// process group of its own, the parent polls the pipe against the deadline, and expiry ends the group.
#include "tools/bench/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

extern char** environ;

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};
constexpr auto kKillGrace = std::chrono::seconds(2);  // SIGTERM to SIGKILL: mpirun's own cleanup

std::string Tail(const std::string& text, size_t max_chars) {
  return text.size() <= max_chars ? text : absl::StrCat("...", text.substr(text.size() - max_chars));
}

// Reads until end of file; EINTR is retried.
absl::Status ReadAll(int fd, std::string* out) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read(child stdout)", errno, __FILE__, __LINE__);
    out->append(buf, static_cast<size_t>(n));
  }
}

// own_group: the child leads a new process group; child_mask: its signal mask (else ours).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, int stdout_fd, int close_fd, bool own_group,
                            const sigset_t* child_mask) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, close_fd);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = 0;
  if (own_group) {
    // A background group that reads the terminal would be stopped (SIGTTIN) until the deadline: the child
    // of a deadline reads nothing (launchers such as Hydra's mpiexec read their stdin).
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
  }
  if (child_mask != nullptr) {
    flags |= POSIX_SPAWN_SETSIGMASK;
    posix_spawnattr_setsigmask(&attr, child_mask);
  }
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return ErrnoError(absl::StrCat("posix_spawnp(", argv[0], ")"), rc, __FILE__, __LINE__);
  return pid;
}

// The exit status as RunAndCapture reports it: the output, or an error naming the command.
absl::StatusOr<std::string> Verdict(const std::vector<std::string>& argv, int status, std::string out) {
  const std::string cmd = absl::StrJoin(argv, " ");
  if (WIFSIGNALED(status)) {
    return absl::AbortedError(
        absl::StrCat("'", cmd, "' was killed by signal ", WTERMSIG(status), "; output: ", Tail(out, 800)));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::AbortedError(
        absl::StrCat("'", cmd, "' exited with status ", WEXITSTATUS(status), "; output: ", Tail(out, 800)));
  }
  return out;
}

// ---- Signal forwarding while a child with a deadline runs in its own group (so the terminal's Ctrl-C
// no longer reaches it). One such child at a time per process; a second concurrent one is not forwarded to.
std::atomic<pid_t> g_forward_group{0};
volatile sig_atomic_t g_forwarded_signal = 0;

extern "C" void ForwardToChildGroup(int sig) {
  const int saved = errno;
  const pid_t group = g_forward_group.load();
  if (group > 0) ::kill(-group, sig);
  g_forwarded_signal = sig;
  errno = saved;
}

class SignalForwarding {
 public:
  // Blocks the forwarded signals until Start (so none arrives between the spawn and the handlers).
  SignalForwarding() {
    sigset_t block;
    sigemptyset(&block);
    for (int s : kForwarded) sigaddset(&block, s);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask_);
  }
  const sigset_t* child_mask() const { return &old_mask_; }

  // Forwards to `group` from now on (if no other child is being forwarded to), then unblocks.
  void Start(pid_t group) {
    pid_t none = 0;
    active_ = g_forward_group.compare_exchange_strong(none, group);
    if (active_) {
      g_forwarded_signal = 0;
      struct sigaction sa = {};
      sa.sa_handler = ForwardToChildGroup;
      sigemptyset(&sa.sa_mask);
      for (size_t i = 0; i < std::size(kForwarded); ++i) sigaction(kForwarded[i], &sa, &old_actions_[i]);
    }
    Unblock();
  }

  // Restores the previous handlers, then raises here a signal that was forwarded (its old disposition
  // acts on it: by default this process ends, as it would have without the child).
  ~SignalForwarding() {
    if (active_) g_forward_group.store(0);  // first: the group may be gone once the child is reaped
    Unblock();
    if (!active_) return;
    for (size_t i = 0; i < std::size(kForwarded); ++i) sigaction(kForwarded[i], &old_actions_[i], nullptr);
    const int sig = g_forwarded_signal;
    g_forwarded_signal = 0;
    if (sig != 0) ::raise(sig);
  }

 private:
  void Unblock() {
    if (unblocked_) return;
    unblocked_ = true;
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  sigset_t old_mask_;
  struct sigaction old_actions_[std::size(kForwarded)];
  bool active_ = false;
  bool unblocked_ = false;
};

void SleepBriefly() {
  const timespec ts{0, 10 * 1000 * 1000};  // 10 ms
  nanosleep(&ts, nullptr);
}

// Ends the group `pid` leads: SIGTERM, up to kKillGrace for the child to exit and the group to empty, then
// SIGKILL; reaps the child (unless `reaped`).
void EndGroup(pid_t pid, bool reaped) {
  ::kill(-pid, SIGTERM);
  const auto give_up = Clock::now() + kKillGrace;
  int status = 0;
  while (Clock::now() < give_up) {
    if (!reaped) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      reaped = r == pid || (r < 0 && errno != EINTR);
    }
    if (reaped && ::kill(-pid, 0) != 0 && errno == ESRCH) return;  // nothing of the group is left
    SleepBriefly();
  }
  ::kill(-pid, SIGKILL);
  while (!reaped) {
    const pid_t r = waitpid(pid, &status, 0);
    reaped = r == pid || (r < 0 && errno != EINTR);
  }
}

std::string Seconds(std::chrono::milliseconds t) { return absl::StrCat(static_cast<double>(t.count()) / 1000, " s"); }

absl::StatusOr<std::string> RunWithDeadline(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno, __FILE__, __LINE__);
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  std::string out;
  absl::Status failure;  // a read or wait error: the group is ended as on expiry
  bool expired = false;
  {
    SignalForwarding forwarding;
    auto pid = Spawn(argv, fds[1], fds[0], /*own_group=*/true, forwarding.child_mask());
    close(fds[1]);
    if (!pid.ok()) {
      close(fds[0]);
      return pid.status();
    }
    forwarding.Start(*pid);
    bool eof = false, reaped = false;
    char buf[65536];
    while (!reaped) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        expired = true;
        break;
      }
      if (!eof) {  // the output first: the child may block on a full pipe
        pollfd p{fds[0], POLLIN, 0};
        const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, INT_MAX)));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          failure = ErrnoError("poll(child stdout)", errno, __FILE__, __LINE__);
          break;
        }
        if (r == 0) continue;  // the deadline, checked above
        const ssize_t n = read(fds[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          failure = ErrnoError("read(child stdout)", errno, __FILE__, __LINE__);
          break;
        }
        if (n == 0) eof = true;
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      const pid_t r = waitpid(*pid, &status, WNOHANG);
      if (r == *pid) {
        reaped = true;
      } else if (r < 0 && errno != EINTR) {
        failure = ErrnoError("waitpid", errno, __FILE__, __LINE__);
        break;
      } else {
        SleepBriefly();  // stdout closed, not exited yet
      }
    }
    close(fds[0]);  // a writer left in the group gets EPIPE / SIGPIPE from here on
    if (!reaped) EndGroup(*pid, /*reaped=*/false);
  }  // forwarding ends: a signal that came meanwhile is raised here
  STRATA_RETURN_IF_ERROR(failure);
  if (expired) {
    return absl::DeadlineExceededError(
        absl::StrCat("'", absl::StrJoin(argv, " "), "' did not finish within ", Seconds(timeout),
                     " (timeout): killed its process group; output so far: ", Tail(out, 800)));
  }
  return Verdict(argv, status, std::move(out));
}

}  // namespace

absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv,
                                          std::optional<std::chrono::milliseconds> timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("RunAndCapture: empty command");
  if (timeout.has_value()) {
    if (timeout->count() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("RunAndCapture: timeout must be positive (got ", timeout->count(), " ms)"));
    }
    return RunWithDeadline(argv, *timeout);
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno, __FILE__, __LINE__);
  auto pid = Spawn(argv, fds[1], fds[0], /*own_group=*/false, nullptr);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  std::string out;
  const absl::Status read_status = ReadAll(fds[0], &out);
  close(fds[0]);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid", errno, __FILE__, __LINE__);
  }
  STRATA_RETURN_IF_ERROR(read_status);
  return Verdict(argv, status, std::move(out));
}

absl::StatusOr<std::string> SelfExecutable() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoError("readlink(/proc/self/exe)", errno, __FILE__, __LINE__);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace strata::tools
