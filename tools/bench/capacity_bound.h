// The physical bound of `strata bench capacity`, and the I/O floor of its largest model's step.
//
// Bound: (free disk on the NVMe path(s) + host budget) / (bytes per parameter that must be kept: the
// config's least, param dtype + fp32 master unless the params are fp32 + optimizer state + fp32 gradient
// unless the update runs in backward); a tier counts only when the engine keeps state on it, so without
// offload the device budget is the room. The engine's own accounting of a finished candidate (its memory
// tracker's persistent kinds: parameter shard, gradient shard, fp32 master, optimizer state, on every
// tier) is printed beside the least: what it keeps above it is the engine's, not the box's, limit. The
// free disk is measured before the first candidate runs.
//
// Floor: the NVMe bytes the engine counted over the last step (read and written) over the bandwidth
// of the same path measured in the same run (fio when installed, else the store's own probe; `strata
// bench nvme`'s RunNvmeBench either way), reads and writes taken as serial on one device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine.h"

namespace strata::tools {

// The distinct NVMe directories of the config (offload_param, offload_optimizer), empty when none is on NVMe.
std::vector<std::string> NvmePaths(const engine::EngineConfig& cfg);

// Free bytes (for an unprivileged writer) on the file systems holding `paths`, each file system once.
absl::StatusOr<uint64_t> FreeDiskBytes(const std::vector<std::string>& paths);

struct BytesPerParam {
  double tier[memory::kNumTiers] = {};  // measured: persistent state on each tier, over the parameters
  double total = 0;
  double formula = 0;  // from the config: param dtype + fp32 master (if the dtype is not fp32) + state + grad
                       // (no grad with strata.optimizer_in_backward)
};
// From `mem` (one rank's tracker) of a model of `params` parameters sharded over `ranks`.
BytesPerParam MeasureBytesPerParam(const engine::EngineConfig& cfg, const engine::MemoryStats& mem, int64_t params,
                                   int ranks);

// Prints the bound's terms, how each was obtained, and `largest` as a fraction of it. The budgets are
// per rank (`ranks` of them on the box), the disk is shared. Returns the bound in parameters (0 when a
// tier that holds state has no budget: no bound).
double PrintCapacityBound(const engine::EngineConfig& cfg, uint64_t free_disk, const BytesPerParam& bpp,
                          int64_t largest, int ranks);

struct StepTiming {
  double step_ms = 0;
  engine::StepResult last;  // the split and the NVMe bytes of that step
  int ranks = 1;
};
// Measures the bandwidth of `paths` (`probe_bytes` written then read) and prints the floor, the ratio
// and the split. An error only when the probe cannot run.
absl::Status PrintIoFloor(const std::vector<std::string>& paths, uint64_t probe_bytes, const StepTiming& t);

}  // namespace strata::tools
