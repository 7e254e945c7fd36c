#include "spec/launch.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/comm/agree.h"
#include "spec/registry.h"

namespace strata::spec {

std::unique_ptr<comm::MpiRuntime> StartMpi(const char* command) {
  int argc = 1;
  char arg0[] = "strata";
  char* argv0[] = {arg0, nullptr};
  char** argv = argv0;
  auto mpi = comm::MpiRuntime::Init(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command, std::string(mpi.status().message()).c_str());
    return nullptr;
  }
  return std::move(*mpi);
}

std::optional<std::string> RefuseHostUnderTorchrun(const comm::Launch& launch, device::DeviceKind kind,
                                                   const std::string& command) {
  return comm::RefuseHostTorchrun(launch, kind, absl::StrCat("strata ", command));
}

std::optional<CommandLaunch> StartLaunch(const std::string& command, int* exit_code) {
  CommandLaunch out;
  out.mpi = StartMpi(command.c_str());
  if (out.mpi == nullptr) {
    *exit_code = 1;
    return std::nullopt;
  }
  auto launch = comm::DetectLaunch(*out.mpi);
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

bool AgreeOnStart(const std::string& command, const CommandLaunch& start, const std::string& mine,
                  int64_t timeout_ms) {
  const comm::Launch& launch = start.launch;
  // Note [Start-up agreement]: every rank learns every rank's outcome before any communicator is made.
  absl::StatusOr<std::vector<std::string>> errors = start.mpi->GatherStartErrors(mine, timeout_ms);
  if (!errors.ok()) {
    if (!mine.empty()) std::fprintf(stderr, "strata %s: rank %d: %s\n", command.c_str(), launch.rank, mine.c_str());
    start.mpi->AbortJob(absl::StrCat("rank ", launch.rank, ": ", errors.status().message()));
  }
  if (errors->size() == 1) {  // one process, or torchrun (no MPI job: each rank is its own MPI world)
    if (mine.empty()) return true;
    if (launch.rank == 0) std::fprintf(stderr, "strata %s: %s\n", command.c_str(), mine.c_str());
    else std::fprintf(stderr, "strata %s: rank %d: %s\n", command.c_str(), launch.rank, mine.c_str());
    return false;
  }
  const std::string report = StartErrorReport(*errors, launch.rank);
  if (!report.empty()) std::fprintf(stderr, "strata %s: %s\n", command.c_str(), report.c_str());
  return std::none_of(errors->begin(), errors->end(), [](const std::string& e) { return !e.empty(); });
}

std::unique_ptr<TrainSetup> SetupForLaunch(const std::string& command, const CommandLaunch& start,
                                           std::vector<std::string> args, const Family** family) {
  absl::StatusOr<const Family*> chosen = *family != nullptr ? *family : TakeFamily(&args);
  absl::StatusOr<std::unique_ptr<TrainSetup>> setup =
      chosen.ok() ? (*chosen)->ParseTrain(args, start.launch.size) : chosen.status();
  std::string mine;
  if (!setup.ok()) {
    mine = std::string(setup.status().message());
  } else if (auto refused = RefuseHostUnderTorchrun(start.launch, (*setup)->device_kind(), command)) {
    mine = *refused;
  }
  const int64_t timeout_ms = setup.ok() ? (*setup)->engine.collective_timeout_ms : comm::Options{}.timeout_ms;
  if (!AgreeOnStart(command, start, mine, timeout_ms)) return nullptr;
  *family = *chosen;
  return *std::move(setup);
}

}  // namespace strata::spec
