// The CUDA back-end module (docs/decisions/0012-cuda-backend-module.md): libstrata_cuda.so holds everything
// that links the CUDA runtime or NCCL, and the core loads it with dlopen when a CUDA device, allocator,
// communicator or tier is first asked for, so the core itself needs no CUDA library to load or to run on
// the host.
//
// The protocol. The module exports one C symbol, strata_cuda_module_part (ModuleEntry), that returns a
// part: a table of C++ function pointers over the existing interfaces (device::Device, memory::Allocator,
// comm::Communicator, memory::TierOps, optim::TierUpdate), one per layer, each declared in its layer's
// cuda_backend.h with its name (kPart) and version (kVersion). Part "identity" (ModuleIdentity) comes first:
// a module whose build string differs from the core's is refused, because the C++ types that cross are the
// same only when both sides come from the same build.
//
// Where. STRATA_CUDA_MODULE (env.h) names the file; else libstrata_cuda.so beside the object that holds
// this code (libstrata.so, or the executable that links the static libraries), then in ../lib from there.
// Loaded once per process and never unloaded (objects it made may live until exit). Absence is not an
// error until a CUDA part is asked for; then the status names every file tried and dlerror()'s text.
//
// The MPI back-end module (docs/decisions/0041-mpi-backend-module.md), libstrata_mpi.so, follows the same
// protocol with its own file, entry (strata_mpi_module_part) and override (STRATA_MPI_MODULE): it holds
// everything that links libmpi, so that libstrata.so loads and runs (strata.torch under torchrun) on a
// machine without MPI; it is loaded when an MPI communicator is first asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/base/status.h"

namespace strata::module {

inline constexpr char kCudaModuleFile[] = "libstrata_cuda.so";
inline constexpr char kCudaModuleEntry[] = "strata_cuda_module_part";
inline constexpr char kMpiModuleFile[] = "libstrata_mpi.so";
inline constexpr char kMpiModuleEntry[] = "strata_mpi_module_part";

// The exported entry: the part `name` if the module has it at `version`, else nullptr with `*has_version`
// set to the version it has (0: no such part).
extern "C" {
using ModuleEntry = const void* (*)(const char* name, uint32_t version, uint32_t* has_version);
}

// Part "identity", asked for before any other.
struct ModuleIdentity {
  static constexpr char kPart[] = "identity";
  static constexpr uint32_t kVersion = 1;
  const char* build;          // BuildId() of the module's build
  void (*set_log_rank)(int);  // the module's copy of the log prefix (its base library is its own)
};

// A module's side of the protocol: its parts, and the lookup its entry point makes over them (the part `name` at
// `version`, else nullptr with `*has_version` set to the version it has, 0 for none).
struct PartEntry {
  const char* name;
  uint32_t version;
  const void* table;
};
const void* FindPart(const PartEntry* parts, size_t count, const char* name, uint32_t version, uint32_t* has_version);

// What both sides must agree on: the project version, the compiler and its version, and a digest of the
// runtime and offload headers (the declarations of every type that crosses).
const char* BuildId();

// The part `name` at `version` of the CUDA module, loading it on the first call (thread-safe).
// FailedPrecondition when the module is absent, cannot be loaded, is of another build, or lacks the part.
absl::StatusOr<const void*> CudaModulePart(const char* name, uint32_t version);

// The part a layer's table type names (Api::kPart, Api::kVersion).
template <class Api>
absl::StatusOr<const Api*> CudaModuleApi() {
  STRATA_ASSIGN_OR_RETURN(const void* p, CudaModulePart(Api::kPart, Api::kVersion));
  return static_cast<const Api*>(p);
}

// The module's file once loaded; empty before, or when it could not be loaded.
std::string LoadedCudaModulePath();

// The part `name` at `version` of the MPI module, as CudaModulePart. FailedPrecondition when the module is
// absent or cannot be loaded (libmpi missing: the message names dlerror()'s text and the two ways out,
// installing Open MPI or launching with torchrun), is of another build, or lacks the part.
absl::StatusOr<const void*> MpiModulePart(const char* name, uint32_t version);

template <class Api>
absl::StatusOr<const Api*> MpiModuleApi() {
  STRATA_ASSIGN_OR_RETURN(const void* p, MpiModulePart(Api::kPart, Api::kVersion));
  return static_cast<const Api*>(p);
}

}  // namespace strata::module
