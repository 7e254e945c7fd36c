// Reading a checkpoint without an engine: whole parameters gathered from every shard by global offset
// (for export), and a full verification of every file and range checksum (for `strata ckpt inspect`).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/manifest.h"

namespace strata::checkpoint {

// Opens `step_dir`'s manifest.
absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir);

// The full fp32 master value of parameter `param` of unit `unit`, assembled from every shard that holds a
// part of it (each range verified). Only that parameter is held in memory.
absl::StatusOr<std::vector<float>> ReadMasterParam(const std::string& step_dir, const Manifest& m, size_t unit,
                                                   size_t param);

struct VerifyReport {
  uint64_t files = 0, ranges = 0, bytes = 0;
};
// Checks every shard's size and header checksum against the manifest and every range's checksum.
absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& step_dir, const Manifest& m);

}  // namespace strata::checkpoint
