// Step diagnostics: watches where each step's time goes and says, in one line, when data wait, exposed
// communication or exposed I/O has stayed above its threshold over a window of steps, naming the likely
// cause and the knob to turn. Each condition is said once; it is said again only when its verdict changes
// (it clears, or comes back) or its cause changes, so a persistent bottleneck is one line, not one per window.
// A condition clears below 3/4 of its threshold, and "descheduled" as a cause holds until the CPU share
// is 0.1 above its threshold (hysteresis), so a value hovering at a threshold does not flap. At the end of the run,
// Summary() is the one line of where the step time went.
//
// Exposed communication has three causes, told apart by what the ranks could see of their host:
//   - more ranks on a host than the cores they may run on: ranks wait for peers the OS has not scheduled;
//   - the ranks' CPU time well under their wall time: they were descheduled (other load on the cores);
//   - otherwise the transfers themselves: the interconnect, or too little compute to hide them.
// Pure logic: tested on recorded step times (tests/models/gpt/train/step_diagnostics_test.cc).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace strata::tools {

struct StepTimes {
  double step_ms = 0;
  double data_wait_ms = 0;
  double exposed_comm_ms = 0;
  double exposed_io_ms = 0;
  double compute_ms = 0;
  double optimizer_ms = 0;
  // The least CPU share any rank had over the step: its process CPU time / wall time (negative: unknown).
  double min_cpu_share = -1;
};

struct DiagnosticThresholds {
  int window = 20;             // steps
  double data_wait = 0.10;     // fraction of step time
  double exposed_comm = 0.30;
  double exposed_io = 0.30;
  double descheduled = 0.75;   // a rank whose CPU share is below this was descheduled
};

// How the ranks sit on their hosts, gathered once at start-up.
struct HostShare {
  int ranks = 1;  // ranks on the most crowded host
  int cores = 0;  // cores those ranks may run on (the union of their affinity masks); 0 = unknown
};

// What one rank tells the others about where it runs: a hash of its host name and its affinity mask.
// Plain bytes, all-gathered as they are.
struct HostRecord {
  uint64_t host = 0;
  uint64_t cpus[16] = {};  // bit i: CPU i (the first 1024 CPUs)
};
HostRecord ThisHost();
// The host with the most ranks per core (ties: the most ranks).
HostShare CrowdedHost(const std::vector<HostRecord>& ranks);

class StepDiagnostics {
 public:
  explicit StepDiagnostics(DiagnosticThresholds t = {}, HostShare share = {}) : t_(t), share_(share) {}

  // Records one step; returns the lines to say now (usually none).
  std::vector<std::string> Observe(const StepTimes& s);

  // Where the step time went over every observed step, as one line ("" before the first step).
  std::string Summary() const;

 private:
  enum class Cause { kNone, kTransfers, kOversubscribed, kDescheduled };
  Cause CommCause(double cpu_share) const;

  DiagnosticThresholds t_;
  HostShare share_;
  std::deque<StepTimes> recent_;
  Cause said_[3] = {Cause::kNone, Cause::kNone, Cause::kNone};  // per condition: what was last said
  StepTimes total_;
  long steps_ = 0;
};

}  // namespace strata::tools
