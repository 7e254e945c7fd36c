// The start every CLI command that runs the GPT on one process per rank shares (train, bench step, bench
// capacity): MPI, then the launch (Note [Launchers] in tools/launch.cc); and for train and bench step the
// options of the command line with the torchrun refusal for their device. Each failure is printed as
// "strata <command>: <why>", with the exit code the commands have always used.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt/train/train_options.h"
#include "runtime/comm/mpi_communicator.h"
#include "tools/launch.h"

namespace strata::tools {

struct CommandLaunch {
  std::unique_ptr<comm::MpiRuntime> mpi;
  Launch launch;
};

// MPI and the launch; nullopt after printing why, with *exit_code 1 (MPI cannot start) or 2 (a bad launch).
std::optional<CommandLaunch> StartLaunch(const std::string& command, int* exit_code);

// The options of `args` for this launch, when the launch can run their device (RefuseHostUnderTorchrun)
// on every rank (Note [Start-up agreement]); nullopt, on every rank, when any rank's could not be read,
// after printing why (exit code 2). Ends the job when a rank does not arrive within the collective timeout.
std::optional<TrainOptions> OptionsForLaunch(const std::string& command, const CommandLaunch& start,
                                             const std::vector<std::string>& args);

}  // namespace strata::tools
