#include "models/gpt/train/step_diagnostics.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/str_format.h"

namespace strata::tools {
namespace {

// One watched condition: which part of StepTimes, its threshold, what it is called, and the advice.
struct Condition {
  double StepTimes::*part;
  double DiagnosticThresholds::*threshold;
  const char* what;  // "<what> %.0f%% of the time"
  const char* advice;
};

constexpr Condition kConditions[] = {
    {&StepTimes::data_wait_ms, &DiagnosticThresholds::data_wait,
     "data loading is the bottleneck: the trainer waited for batches",
     "The loader prepares batches on one background thread: use a pre-tokenised llm.c token file (--data) "
     "rather than text, put the data on a faster disk, or raise --micro-batch so each step does more compute "
     "per batch read"},
    {&StepTimes::exposed_comm_ms, &DiagnosticThresholds::exposed_comm,
     "communication is exposed: the trainer waited on collectives",
     "Gather further ahead (--prefetch 2 with --max-live-units 3), use larger micro-batches (--micro-batch) so "
     "compute covers the transfers, or a lower ZeRO stage (--stage 2 keeps parameters replicated: no gathers); "
     "check the interconnect with `strata doctor`"},
    {&StepTimes::exposed_io_ms, &DiagnosticThresholds::exposed_io,
     "offload I/O is exposed: the trainer waited on I/O",
     "Raise the budget of the faster tier (--device-budget / --host-budget) so fewer shards spill, raise "
     "offload buffer_count, or check the NVMe path with `strata doctor --nvme-path`"},
};
constexpr int kComm = 1;
static_assert(std::size(kConditions) == 3, "one said_ entry per condition (step_diagnostics.h)");

}  // namespace

HostRecord ThisHost() {
  HostRecord r;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) r.host = std::hash<std::string>{}(name);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < 1024 && c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) r.cpus[c / 64] |= uint64_t{1} << (c % 64);
    }
  }
  return r;
}

HostShare CrowdedHost(const std::vector<HostRecord>& ranks) {
  std::map<uint64_t, std::pair<int, HostRecord>> hosts;  // host -> (ranks, union of masks)
  for (const HostRecord& r : ranks) {
    auto& [count, all] = hosts[r.host];
    ++count;
    for (int w = 0; w < 16; ++w) all.cpus[w] |= r.cpus[w];
  }
  HostShare worst;
  for (const auto& [host, entry] : hosts) {
    int cores = 0;
    for (uint64_t w : entry.second.cpus) cores += std::popcount(w);
    const HostShare h{entry.first, cores};
    // ranks/cores > worst.ranks/worst.cores, in integers; an unknown core count (0) never wins.
    const bool worse =
        h.cores > 0 && (worst.cores == 0 || int64_t{h.ranks} * worst.cores > int64_t{worst.ranks} * h.cores ||
                        (int64_t{h.ranks} * worst.cores == int64_t{worst.ranks} * h.cores && h.ranks > worst.ranks));
    if (worse) worst = h;
  }
  return worst;
}

StepDiagnostics::Cause StepDiagnostics::CommCause(double cpu_share) const {
  if (share_.cores > 0 && share_.ranks > share_.cores) return Cause::kOversubscribed;
  // Hysteresis, as for the verdict: once said, "descheduled" holds until the share is clearly back
  // (ranks sharing their cores hover near the threshold, and the cause would flip every window).
  const double limit = said_[kComm] == Cause::kDescheduled ? t_.descheduled + 0.1 : t_.descheduled;
  if (cpu_share >= 0 && cpu_share < limit) return Cause::kDescheduled;
  return Cause::kTransfers;
}

std::vector<std::string> StepDiagnostics::Observe(const StepTimes& s) {
  ++steps_;
  total_.step_ms += s.step_ms;
  total_.data_wait_ms += s.data_wait_ms;
  total_.exposed_comm_ms += s.exposed_comm_ms;
  total_.exposed_io_ms += s.exposed_io_ms;
  total_.compute_ms += s.compute_ms;
  total_.optimizer_ms += s.optimizer_ms;
  recent_.push_back(s);
  if (static_cast<int>(recent_.size()) > t_.window) recent_.pop_front();
  std::vector<std::string> lines;
  if (static_cast<int>(recent_.size()) < t_.window) return lines;
  double step = 0, cpu = 0;
  int cpu_known = 0;
  for (const StepTimes& r : recent_) {
    step += r.step_ms;
    if (r.min_cpu_share >= 0) cpu += r.min_cpu_share, ++cpu_known;
  }
  if (step <= 0) return lines;
  const double cpu_share = cpu_known > 0 ? cpu / cpu_known : -1;
  for (size_t c = 0; c < std::size(kConditions); ++c) {
    const Condition& cond = kConditions[c];
    double part = 0;
    for (const StepTimes& r : recent_) part += r.*cond.part;
    const double frac = part / step, threshold = t_.*cond.threshold;
    const bool on = said_[c] == Cause::kNone ? frac > threshold : frac > 0.75 * threshold;
    const Cause cause = !on ? Cause::kNone : c == kComm ? CommCause(cpu_share) : Cause::kTransfers;
    if (cause == said_[c]) continue;
    said_[c] = cause;
    const std::string measured = absl::StrFormat("%.0f%% of the time over the last %d steps (threshold %.0f%%)",
                                                 100 * frac, t_.window, 100 * threshold);
    switch (cause) {
      case Cause::kNone:
        lines.push_back(absl::StrFormat("diagnostic cleared: %s %s", cond.what, measured));
        break;
      case Cause::kTransfers:
        lines.push_back(absl::StrFormat("diagnostic: %s %s. %s", cond.what, measured, cond.advice));
        break;
      case Cause::kOversubscribed:
        lines.push_back(absl::StrFormat(
            "diagnostic: %s %s, but not because of the interconnect: %d ranks share %d cores on one host, so "
            "each waits for peers the OS has not scheduled. Run at most one rank per core (mpirun -n %d) for "
            "speed; results are the same either way",
            cond.what, measured, share_.ranks, share_.cores, std::max(1, share_.cores)));
        break;
      case Cause::kDescheduled:
        lines.push_back(absl::StrFormat(
            "diagnostic: %s %s, but not because of the interconnect: a rank got only %.0f%% of a core (CPU time "
            "over wall time), so ranks were descheduled while their peers waited. Something else is using the "
            "cores: check with `top`, bind ranks to cores (mpirun --bind-to core) or run fewer ranks",
            cond.what, measured, 100 * cpu_share));
        break;
    }
  }
  return lines;
}

std::string StepDiagnostics::Summary() const {
  if (steps_ == 0 || total_.step_ms <= 0) return "";
  const double t = total_.step_ms;
  const double other = std::max(0.0, t - total_.compute_ms - total_.exposed_comm_ms - total_.exposed_io_ms -
                                          total_.optimizer_ms - total_.data_wait_ms);
  std::string line = absl::StrFormat(
      "step time (mean %.1f ms over %ld steps): compute %.0f%% | exposed communication %.0f%% | exposed I/O "
      "%.0f%% | optimizer %.0f%% | data wait %.0f%% | other %.0f%%",
      t / steps_, steps_, 100 * total_.compute_ms / t, 100 * total_.exposed_comm_ms / t,
      100 * total_.exposed_io_ms / t, 100 * total_.optimizer_ms / t, 100 * total_.data_wait_ms / t, 100 * other / t);
  if (share_.cores > 0 && share_.ranks > share_.cores) {
    line += absl::StrFormat(" (%d ranks on %d cores: waits include peers not scheduled)", share_.ranks, share_.cores);
  }
  return line;
}

}  // namespace strata::tools
