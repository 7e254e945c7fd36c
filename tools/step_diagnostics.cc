#include "tools/step_diagnostics.h"

#include "absl/strings/str_format.h"

namespace strata::tools {

std::optional<std::string> StepDiagnostics::Observe(const StepTimes& s) {
  recent_.push_back(s);
  if (static_cast<int>(recent_.size()) > t_.window) recent_.pop_front();
  for (int* q : {&quiet_data_, &quiet_comm_, &quiet_io_}) *q = *q > 0 ? *q - 1 : 0;
  if (static_cast<int>(recent_.size()) < t_.window) return std::nullopt;
  double step = 0, data = 0, comm = 0, io = 0;
  for (const StepTimes& r : recent_) {
    step += r.step_ms;
    data += r.data_wait_ms;
    comm += r.exposed_comm_ms;
    io += r.exposed_io_ms;
  }
  if (step <= 0) return std::nullopt;
  if (data / step > t_.data_wait && quiet_data_ == 0) {
    quiet_data_ = t_.window;
    return absl::StrFormat(
        "diagnostic: data loading is the bottleneck: the trainer waited for batches %.0f%% of the time over the "
        "last %d steps (threshold %.0f%%). The loader prepares batches on one background thread: use a "
        "pre-tokenised llm.c token file (--data) rather than text, put the data on a faster disk, or raise "
        "--micro-batch so each step does more compute per batch read",
        100 * data / step, t_.window, 100 * t_.data_wait);
  }
  if (comm / step > t_.exposed_comm && quiet_comm_ == 0) {
    quiet_comm_ = t_.window;
    return absl::StrFormat(
        "diagnostic: communication is exposed: the trainer waited on collectives %.0f%% of the time over the last "
        "%d steps (threshold %.0f%%). Gather further ahead (--prefetch 2 with --max-live-units 3), use larger "
        "micro-batches (--micro-batch) so compute covers the transfers, or a lower ZeRO stage (--stage 2 keeps "
        "parameters replicated: no gathers); check the interconnect with `strata doctor`",
        100 * comm / step, t_.window, 100 * t_.exposed_comm);
  }
  if (io / step > t_.exposed_io && quiet_io_ == 0) {
    quiet_io_ = t_.window;
    return absl::StrFormat(
        "diagnostic: offload I/O is exposed: the trainer waited on I/O %.0f%% of the time over the last %d steps "
        "(threshold %.0f%%). Raise the budget of the faster tier (--device-budget / --host-budget) so fewer shards "
        "spill, raise offload buffer_count, or check the NVMe path with `strata doctor --nvme-path`",
        100 * io / step, t_.window, 100 * t_.exposed_io);
  }
  return std::nullopt;
}

}  // namespace strata::tools
