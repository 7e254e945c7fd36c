#include "runtime/base/env.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::env {

std::optional<std::string> Get(absl::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::StatusOr<long long> GetInt(absl::string_view name, long long fallback) {
  auto v = Get(name);
  if (!v) return fallback;
  long long out = 0;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v, "' is not an integer"));
  }
  return out;
}

namespace {
std::optional<int> FirstInt(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto v = Get(n);
    int out = 0;
    if (v && absl::SimpleAtoi(*v, &out)) return out;
  }
  return std::nullopt;
}
}  // namespace

std::optional<int> LauncherRank() {
  return FirstInt({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"});
}
std::optional<int> LauncherWorldSize() {
  if (auto n = MpiLauncherWorldSize()) return n;
  return FirstInt({"SLURM_NTASKS", "WORLD_SIZE"});
}

std::optional<int> MpiLauncherWorldSize() { return FirstInt({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}); }

std::optional<int> LauncherLocalRank() {
  return FirstInt({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"});
}

std::optional<int> LauncherLocalWorldSize() {
  return FirstInt({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"});
}

TorchrunVars Torchrun() {
  return TorchrunVars{Get("RANK"),
                      Get("WORLD_SIZE"),
                      Get("LOCAL_RANK"),
                      Get("MASTER_ADDR"),
                      Get("MASTER_PORT"),
                      Get("STRATA_BOOTSTRAP_PORT"),
                      Get("TORCHELASTIC_RUN_ID"),
                      Get("TORCHELASTIC_RESTART_COUNT"),
                      Get("TORCHELASTIC_USE_AGENT_STORE"),
                      Get("LOCAL_WORLD_SIZE")};
}

std::string LogLevel() { return Get("STRATA_LOG_LEVEL").value_or("info"); }

std::string ForcedCpuIsa() { return Get("STRATA_CPU_ISA").value_or(""); }

std::string ExecutableSearchPath() { return Get("PATH").value_or(""); }

std::optional<std::string> CudaVisibleDevices() { return Get("CUDA_VISIBLE_DEVICES"); }

namespace {

// A module's path override: nullopt when unset or empty.
std::optional<std::string> NonEmpty(const char* name) {
  std::optional<std::string> v = Get(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::string> CudaModulePath() { return NonEmpty("STRATA_CUDA_MODULE"); }

std::optional<std::string> MpiModulePath() { return NonEmpty("STRATA_MPI_MODULE"); }

std::string ForcedIoBackend() { return Get("STRATA_IO_BACKEND").value_or(""); }

}  // namespace strata::env
