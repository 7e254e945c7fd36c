// The one place that reads the process environment (CONVENTIONS 6). Everything else receives values
// from here, so tests can see every knob in one file.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace strata::env {

// Raw lookup; nullopt when unset.
std::optional<std::string> Get(absl::string_view name);

// Integer variable; `fallback` when unset, InvalidArgument naming the variable when malformed.
absl::StatusOr<long long> GetInt(absl::string_view name, long long fallback);

// Launcher-provided rank / world size: OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/SLURM_NTASKS, then
// torchrun's RANK / WORLD_SIZE. nullopt when none is set.
std::optional<int> LauncherRank();
std::optional<int> LauncherWorldSize();
// The world size an MPI launcher (mpirun: OMPI_COMM_WORLD_SIZE, PMI_SIZE) set for this process; nullopt
// when none did. Slurm's variables do not count: torchrun workers inside an allocation inherit them.
std::optional<int> MpiLauncherWorldSize();
// The rank within this node (which GPU to use): OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// SLURM_LOCALID, then torchrun's LOCAL_RANK. nullopt when none is set.
std::optional<int> LauncherLocalRank();
// The ranks the launcher started on this node: OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS (MPICH's Hydra),
// then torchrun's LOCAL_WORLD_SIZE. nullopt when none is set (Slurm's per-node counts are not one number).
std::optional<int> LauncherLocalWorldSize();

// torchrun-style launch variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, torchrun's
// TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE and LOCAL_WORLD_SIZE, and the
// retired STRATA_BOOTSTRAP_PORT (refused by name); raw text, nullopt when unset; parsed and validated by
// comm::ParseTorchrunEnv.
struct TorchrunVars {
  std::optional<std::string> rank, world_size, local_rank, master_addr, master_port, bootstrap_port;
  std::optional<std::string> run_id, restart_count, use_agent_store, local_world_size;
};
TorchrunVars Torchrun();

// STRATA_LOG_LEVEL: debug|info|warning|error (default info).
std::string LogLevel();

// STRATA_CPU_ISA: force a kernel variant (scalar|avx2|avx512); empty when unset.
std::string ForcedCpuIsa();

// PATH, for finding launchers (strata doctor); empty when unset.
std::string ExecutableSearchPath();

// CUDA_VISIBLE_DEVICES as set (may be empty: no GPU visible to CUDA); nullopt when unset.
std::optional<std::string> CudaVisibleDevices();

// STRATA_CUDA_MODULE: the path of the CUDA back-end module to load instead of the libstrata_cuda.so found
// beside the library or executable (runtime/base/module.h); nullopt when unset or empty.
std::optional<std::string> CudaModulePath();

// STRATA_MPI_MODULE: the same for the MPI back-end module, libstrata_mpi.so (docs/decisions/0041).
std::optional<std::string> MpiModulePath();

// STRATA_IO_BACKEND: force the offload I/O back-end when the caller asked for "auto" (uring|threads);
// empty when unset. runtime/offload/io_queue.h validates the value.
std::string ForcedIoBackend();

}  // namespace strata::env
