#include "runtime/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/base/env.h"

namespace strata {
namespace {

std::atomic<int> g_rank{-1};

LogSeverity SeverityFromEnv() {
  const std::string v = env::LogLevel();
  if (v == "debug") return LogSeverity::kDebug;
  if (v == "warning") return LogSeverity::kWarning;
  if (v == "error") return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinSeverity() {
  static std::atomic<int> min{static_cast<int>(SeverityFromEnv())};
  return min;
}

}  // namespace

void SetLogRank(int rank) { g_rank.store(rank); }
int LogRank() { return g_rank.load(); }
void SetMinLogSeverity(LogSeverity s) { MinSeverity().store(static_cast<int>(s)); }
bool LogEnabled(LogSeverity s) { return static_cast<int>(s) >= MinSeverity().load(); }

void LogLine(LogSeverity s, absl::string_view msg) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  const int rank = g_rank.load();
  std::string line = rank >= 0
                         ? absl::StrCat("[strata r", rank, " ", std::string(1, kLetters[static_cast<int>(s)]), "] ")
                         : absl::StrCat("[strata ", std::string(1, kLetters[static_cast<int>(s)]), "] ");
  absl::StrAppend(&line, msg, "\n");
  // One write per line: atomic for pipes up to PIPE_BUF, good enough for terminals and files.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace strata
