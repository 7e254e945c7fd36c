// posix_spawnp with a pipe on stdout. The parent closes its copy of the write end before reading, so
// end of file arrives when the child (and anything it spawned that kept the pipe) has exited; the child
// gets no other descriptors of ours beyond what is not close-on-exec.
#include "tools/bench/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

extern char** environ;

namespace strata::tools {
namespace {

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

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, int stdout_fd, int close_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, close_fd);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return ErrnoError(absl::StrCat("posix_spawnp(", argv[0], ")"), rc, __FILE__, __LINE__);
  return pid;
}

}  // namespace

absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("RunAndCapture: empty command");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno, __FILE__, __LINE__);
  auto pid = Spawn(argv, fds[1], fds[0]);
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
  const std::string cmd = absl::StrJoin(argv, " ");
  if (WIFSIGNALED(status)) {
    return absl::AbortedError(absl::StrCat("'", cmd, "' was killed by signal ", WTERMSIG(status), "; output: ", Tail(out, 800)));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::AbortedError(absl::StrCat("'", cmd, "' exited with status ", WEXITSTATUS(status), "; output: ", Tail(out, 800)));
  }
  return out;
}

absl::StatusOr<std::string> SelfExecutable() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoError("readlink(/proc/self/exe)", errno, __FILE__, __LINE__);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace strata::tools
