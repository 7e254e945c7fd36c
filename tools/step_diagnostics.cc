#include "tools/step_diagnostics.h"

#include <iterator>

#include "absl/strings/str_format.h"

namespace strata::tools {
namespace {

// One watched condition: which part of StepTimes, its threshold, and the message (which gets the
// percentage, the window and the threshold percentage, in that order).
struct Condition {
  double StepTimes::*part;
  double DiagnosticThresholds::*threshold;
  const char* message;
};

constexpr Condition kConditions[] = {
    {&StepTimes::data_wait_ms, &DiagnosticThresholds::data_wait,
     "diagnostic: data loading is the bottleneck: the trainer waited for batches %.0f%% of the time over the "
     "last %d steps (threshold %.0f%%). The loader prepares batches on one background thread: use a "
     "pre-tokenised llm.c token file (--data) rather than text, put the data on a faster disk, or raise "
     "--micro-batch so each step does more compute per batch read"},
    {&StepTimes::exposed_comm_ms, &DiagnosticThresholds::exposed_comm,
     "diagnostic: communication is exposed: the trainer waited on collectives %.0f%% of the time over the last "
     "%d steps (threshold %.0f%%). Gather further ahead (--prefetch 2 with --max-live-units 3), use larger "
     "micro-batches (--micro-batch) so compute covers the transfers, or a lower ZeRO stage (--stage 2 keeps "
     "parameters replicated: no gathers); check the interconnect with `strata doctor`"},
    {&StepTimes::exposed_io_ms, &DiagnosticThresholds::exposed_io,
     "diagnostic: offload I/O is exposed: the trainer waited on I/O %.0f%% of the time over the last %d steps "
     "(threshold %.0f%%). Raise the budget of the faster tier (--device-budget / --host-budget) so fewer shards "
     "spill, raise offload buffer_count, or check the NVMe path with `strata doctor --nvme-path`"},
};
static_assert(std::size(kConditions) == 3, "one quiet counter per condition (step_diagnostics.h)");

}  // namespace

std::optional<std::string> StepDiagnostics::Observe(const StepTimes& s) {
  recent_.push_back(s);
  if (static_cast<int>(recent_.size()) > t_.window) recent_.pop_front();
  for (int& q : quiet_) q = q > 0 ? q - 1 : 0;
  if (static_cast<int>(recent_.size()) < t_.window) return std::nullopt;
  double step = 0;
  for (const StepTimes& r : recent_) step += r.step_ms;
  if (step <= 0) return std::nullopt;
  for (size_t c = 0; c < std::size(kConditions); ++c) {
    const Condition& cond = kConditions[c];
    double part = 0;
    for (const StepTimes& r : recent_) part += r.*cond.part;
    const double threshold = t_.*cond.threshold;
    if (part / step > threshold && quiet_[c] == 0) {
      quiet_[c] = t_.window;
      // The messages are constants with exactly these conversions, so parsing cannot fail.
      const auto format = absl::ParsedFormat<'f', 'd', 'f'>::New(cond.message);
      return absl::StrFormat(*format, 100 * part / step, t_.window, 100 * threshold);
    }
  }
  return std::nullopt;
}

}  // namespace strata::tools
