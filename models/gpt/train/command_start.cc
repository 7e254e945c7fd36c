#include "models/gpt/train/command_start.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "runtime/comm/agree.h"

#include "models/gpt/train/compute.h"
#include "tools/cli/mpi_command.h"

namespace strata::tools {

std::optional<CommandLaunch> StartLaunch(const std::string& command, int* exit_code) {
  CommandLaunch out;
  out.mpi = StartMpi(command.c_str());
  if (out.mpi == nullptr) {
    *exit_code = 1;
    return std::nullopt;
  }
  auto launch = DetectLaunch(*out.mpi);
  if (!launch.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command.c_str(), std::string(launch.status().message()).c_str());
    *exit_code = 2;
    return std::nullopt;
  }
  out.launch = *std::move(launch);
  return out;
}

namespace {

// What this rank prints of every rank's start-up errors (Note [Start-up agreement]), "" for nothing: when
// every rank failed alike (the same flags everywhere), rank 0 speaks for them; otherwise every rank names
// the failing ranks, a failing one its own cause first.
std::string StartErrorReport(const std::vector<std::string>& errors, int me) {
  std::vector<int> failed;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
    if (!errors[r].empty()) failed.push_back(r);
  }
  if (failed.empty()) return "";
  const bool alike = failed.size() == errors.size() &&
                     std::all_of(errors.begin(), errors.end(), [&](const std::string& e) { return e == errors[0]; });
  if (alike) return me == 0 ? errors[0] : "";
  if (!errors[me].empty()) {
    return failed.size() == 1 ? absl::StrCat("rank ", me, ": ", errors[me])
                              : absl::StrCat("rank ", me, ": ", errors[me], " (", failed.size() - 1,
                                             " other rank(s) failed too)");
  }
  const int first = failed[0];
  return absl::StrCat("rank ", me, " stops: ", comm::RanksText(failed), " failed at start-up; rank ", first, ": ",
                      errors[first]);
}

}  // namespace

std::optional<TrainOptions> OptionsForLaunch(const std::string& command, const CommandLaunch& start,
                                             const std::vector<std::string>& args) {
  const Launch& launch = start.launch;
  absl::StatusOr<TrainOptions> opts = ParseTrainOptions(args, launch.size);
  std::string mine;
  if (!opts.ok()) {
    mine = std::string(opts.status().message());
  } else if (auto refused = RefuseHostUnderTorchrun(launch, DeviceKindFor(opts->device), command)) {
    mine = *refused;
  }
  // Note [Start-up agreement]: every rank learns every rank's outcome before any communicator is made.
  const int64_t timeout_ms = opts.ok() ? opts->engine.collective_timeout_ms : comm::Options{}.timeout_ms;
  absl::StatusOr<std::vector<std::string>> errors = start.mpi->GatherStartErrors(mine, timeout_ms);
  if (!errors.ok()) {
    if (!mine.empty()) std::fprintf(stderr, "strata %s: rank %d: %s\n", command.c_str(), launch.rank, mine.c_str());
    start.mpi->AbortJob(absl::StrCat("rank ", launch.rank, ": ", errors.status().message()));
  }
  if (errors->size() == 1) {  // one process, or torchrun (no MPI job: each rank is its own MPI world)
    if (mine.empty()) return *std::move(opts);
    if (launch.rank == 0) std::fprintf(stderr, "strata %s: %s\n", command.c_str(), mine.c_str());
    else std::fprintf(stderr, "strata %s: rank %d: %s\n", command.c_str(), launch.rank, mine.c_str());
    return std::nullopt;
  }
  const std::string report = StartErrorReport(*errors, launch.rank);
  if (!report.empty()) std::fprintf(stderr, "strata %s: %s\n", command.c_str(), report.c_str());
  if (std::any_of(errors->begin(), errors->end(), [](const std::string& e) { return !e.empty(); })) return std::nullopt;
  return *std::move(opts);
}

}  // namespace strata::tools
