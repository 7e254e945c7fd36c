#include "models/gpt/train/command_start.h"

#include <cstdio>

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

std::optional<TrainOptions> OptionsForLaunch(const std::string& command, const Launch& launch,
                                             const std::vector<std::string>& args) {
  auto opts = ParseTrainOptions(args, launch.size);
  if (!opts.ok()) {
    // Every rank parses the same flags, so rank 0 speaks for them; a rank whose flags alone are wrong (an
    // MPMD launch, a per-node config file) says so itself, naming its rank (TrainCommand then ends the job).
    if (launch.rank == 0) {
      std::fprintf(stderr, "strata %s: %s\n", command.c_str(), std::string(opts.status().message()).c_str());
    } else {
      std::fprintf(stderr, "strata %s: rank %d: %s\n", command.c_str(), launch.rank,
                   std::string(opts.status().message()).c_str());
    }
    return std::nullopt;
  }
  if (auto refused = RefuseHostUnderTorchrun(launch, DeviceKindFor(opts->device), command)) {
    if (launch.rank == 0) std::fprintf(stderr, "strata %s: %s\n", command.c_str(), refused->c_str());
    return std::nullopt;
  }
  return *std::move(opts);
}

}  // namespace strata::tools
