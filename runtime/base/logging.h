// Logging with a rank prefix: "[strata r2 I] message". Thread-safe; one line per message, written to
// stderr in one write so lines from threads and ranks do not interleave mid-line.
#pragma once

#include <sstream>
#include "absl/strings/string_view.h"

namespace strata {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// The rank shown in the prefix (-1: none). Set once by the communicator bootstrap.
void SetLogRank(int rank);
int LogRank();
// Messages below this severity are dropped. Default from STRATA_LOG_LEVEL.
void SetMinLogSeverity(LogSeverity s);
bool LogEnabled(LogSeverity s);
void LogLine(LogSeverity s, absl::string_view msg);

class LogMessage {
 public:
  explicit LogMessage(LogSeverity s) : severity_(s) {}
  ~LogMessage() { LogLine(severity_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace strata

// The switch makes the macro one statement, so `if (x) STRATA_LOG(Info) << ...;` has no dangling else.
#define STRATA_LOG(sev)                                                  \
  switch (0)                                                             \
  case 0:                                                                \
  default:                                                               \
    if (!::strata::LogEnabled(::strata::LogSeverity::k##sev)) {          \
    } else                                                               \
      ::strata::LogMessage(::strata::LogSeverity::k##sev).stream()
