// The capacity search's JSON-lines file and its stop handler: see capacity_results.h.
#include "tools/bench/capacity_results.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::tools {
namespace {

// Process-wide because a signal handler can reach nothing else; all of it is lock-free atomics or
// written once before the handler is installed.
std::atomic<int> g_fd{-1};
std::atomic<int> g_finished{0};
std::atomic<int> g_state{0};  // 0 idle, 1 a line is being written, 2 the process is ending
std::atomic<int> g_pending{0};  // the signal that arrived during a write, 0 if none
char g_where[512];                // " in <path>" or "", for the message

void WriteAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0 && errno != EINTR) return;
    if (w > 0) s += w, n -= static_cast<size_t>(w);
  }
}

// Async-signal-safe: write(2) and _exit only; the number is formatted by hand.
[[noreturn]] void Stop(int sig) {
  char n[16];
  int len = 0;
  for (int v = g_finished.load(); len == 0 || v > 0; v /= 10) n[len++] = static_cast<char>('0' + v % 10);
  char num[16];
  for (int i = 0; i < len; ++i) num[i] = n[len - 1 - i];
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  WriteAll("\nstrata bench capacity: stopped by ", 35);
  WriteAll(name, std::strlen(name));
  WriteAll("; finished candidates: ", 23);
  WriteAll(num, static_cast<size_t>(len));
  WriteAll(g_where, std::strlen(g_where));
  WriteAll("\n", 1);
  _exit(128 + sig);
}

extern "C" void OnCapacitySignal(int sig) {
  g_pending.store(sig);
  int idle = 0;
  if (g_state.compare_exchange_strong(idle, 2)) Stop(sig);
  // A line is being written: its writer ends the process once the line is whole.
}

}  // namespace

absl::Status CapacityResults::Open(const std::string& path) {
  path_ = path;
  if (!path.empty()) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
      return absl::PermissionDeniedError(absl::StrCat("cannot append to '", path, "': ", std::strerror(errno)));
    g_fd.store(fd);
  }
  const std::string where = path.empty() ? std::string(" (no --results file)") : absl::StrCat(", in ", path);
  std::strncpy(g_where, where.c_str(), sizeof(g_where) - 1);
  struct sigaction sa {};
  sa.sa_handler = OnCapacitySignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return absl::OkStatus();
}

absl::Status CapacityResults::Append(const nlohmann::json& line) {
  int idle = 0;
  if (!g_state.compare_exchange_strong(idle, 1)) pause();  // the process is ending (Note [Interrupted search])
  absl::Status status;
  const int fd = g_fd.load();
  if (fd >= 0) {
    const std::string text = line.dump() + "\n";
    const ssize_t w = write(fd, text.data(), text.size());  // one write: O_APPEND keeps it whole
    if (w != static_cast<ssize_t>(text.size())) {
      status =
          absl::DataLossError(absl::StrCat("writing '", path_, "': ", w < 0 ? std::strerror(errno) : "short write"));
    } else {
      fdatasync(fd);
    }
  }
  g_finished.fetch_add(1);
  g_state.store(0);
  if (const int sig = g_pending.load(); sig != 0) {
    idle = 0;
    if (g_state.compare_exchange_strong(idle, 2)) Stop(sig);
  }
  return status;
}

int CapacityResults::finished() const { return g_finished.load(); }

}  // namespace strata::tools
