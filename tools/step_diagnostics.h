// Step diagnostics: watches where each step's time goes and, when data wait, exposed communication or
// exposed I/O stays above its threshold over a whole window of steps, returns one line naming the likely
// cause and the knob to turn. After firing, a condition stays quiet for a window, so a persistent
// bottleneck is reported once per window, not every step. Pure logic: tested on recorded step times.
#pragma once

#include <deque>
#include <optional>
#include <string>

namespace strata::tools {

struct StepTimes {
  double step_ms = 0;
  double data_wait_ms = 0;
  double exposed_comm_ms = 0;
  double exposed_io_ms = 0;
};

struct DiagnosticThresholds {
  int window = 20;             // steps
  double data_wait = 0.10;     // fraction of step time
  double exposed_comm = 0.30;
  double exposed_io = 0.30;
};

class StepDiagnostics {
 public:
  explicit StepDiagnostics(DiagnosticThresholds t = {}) : t_(t) {}
  // Records one step; returns a message when a condition has held over the last `window` steps.
  std::optional<std::string> Observe(const StepTimes& s);

 private:
  DiagnosticThresholds t_;
  std::deque<StepTimes> recent_;
  int quiet_[3] = {0, 0, 0};  // per condition (data wait, exposed communication, exposed I/O)
};

}  // namespace strata::tools
