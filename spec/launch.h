// How a CLI command that runs one process per rank starts (`strata train`, `bench step`, `bench capacity`):
// MPI, then the launch (Note [Launchers] in runtime/comm/launcher.cc), every rank's start-up outcome agreed
// (Note [Start-up agreement] in runtime/comm/mpi_communicator.cc), then the job: the communicators with the
// model family's device bring-up. Each failure is printed as "strata <command>: <why>", with the exit code
// the commands have always used. Shared by tools/ and models/ (docs/decisions/0035-model-interface.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "runtime/base/status.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/device.h"
#include "spec/family.h"

namespace strata::spec {

// MPI initialised once, with MPI_THREAD_MULTIPLE; nullptr after printing why ("strata train: ...").
// The runtime finalises MPI when it goes out of scope.
std::unique_ptr<comm::MpiRuntime> StartMpi(const char* command);

// comm::RefuseHostTorchrun for `strata <command>`.
std::optional<std::string> RefuseHostUnderTorchrun(const comm::Launch& launch, device::DeviceKind kind,
                                                   const std::string& command);

struct CommandLaunch {
  std::unique_ptr<comm::MpiRuntime> mpi;
  comm::Launch launch;
};

// MPI and the launch; nullopt after printing why, with *exit_code 1 (MPI cannot start) or 2 (a bad launch).
std::optional<CommandLaunch> StartLaunch(const std::string& command, int* exit_code);

// Every rank's start-up error (`mine`: this rank's, "" for none), agreed before any communicator is made
// (Note [Start-up agreement]): true on every rank when none failed; else false on every rank after printing
// why. Ends the job when a rank does not arrive within `timeout_ms`.
bool AgreeOnStart(const std::string& command, const CommandLaunch& start, const std::string& mine, int64_t timeout_ms);

// The setup of `args` by *family for this launch, when the launch can run its device (RefuseHostUnderTorchrun)
// on every rank (AgreeOnStart); nullptr, on every rank, when any rank's could not be read (exit code 2). A null
// *family is the one --model-family names in `args` (spec/registry.h TakeFamily), set on success.
std::unique_ptr<TrainSetup> SetupForLaunch(const std::string& command, const CommandLaunch& start,
                                           std::vector<std::string> args, const Family** family);

// What a command runs on: a family's compute (a device and its back-end) and the job's communicators,
// declared last so that they go before the device.
template <class C>
struct Job {
  C compute;
  comm::Worlds worlds;
};

// Collective; call after RefuseHostUnderTorchrun said nothing. comm::StartWorlds with `make(local_rank)` (under
// torchrun the launcher's LOCAL_RANK, else nullopt) as the device bring-up.
template <class C>
absl::StatusOr<Job<C>> StartJob(comm::MpiRuntime& mpi, const comm::Launch& launch, device::DeviceKind kind,
                                const comm::Options& options,
                                absl::FunctionRef<absl::StatusOr<C>(std::optional<int>)> make) {
  const std::optional<int> local_rank =
      launch.torchrun ? std::optional<int>(launch.torchrun->local_rank) : std::nullopt;
  absl::StatusOr<C> compute = absl::UnknownError("the device was not started");
  STRATA_ASSIGN_OR_RETURN(comm::Worlds worlds, comm::StartWorlds(mpi, launch, kind, options, [&] {
                            compute = make(local_rank);
                            return compute.status();
                          }));
  return Job<C>{std::move(*compute), std::move(worlds)};
}

}  // namespace strata::spec
