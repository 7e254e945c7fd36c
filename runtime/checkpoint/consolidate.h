// Reading a checkpoint: its manifest (confined to the step directory, validated, its step against the
// directory's name), its shards (each opened inside the step directory and checked against the manifest),
// whole parameters gathered from every shard by global offset (for export), and a full verification of
// every file, range checksum and of the ranges' coverage (for `strata ckpt inspect --verify`). The engine
// reads through the same functions, so every reader applies the same checks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/shard_file.h"

namespace strata::checkpoint {

// Opens and validates `step_dir`'s manifest (ParseManifest). A directory named for a step
// (ParseStepDirName) must not hold a manifest of a later step: the engine's step counts applied updates,
// which never exceed the steps a trainer names its directories by (skipped fp16 steps make it smaller).
absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir);

// The shard of `rank` listed in `m`, opened inside `step_dir` and checked against the manifest: size,
// header checksum, and the rank and world size its header states.
absl::StatusOr<ShardReader> OpenShard(const std::string& step_dir, const Manifest& m, int rank);

// The full fp32 master value of parameter `param` of unit `unit`, assembled from every shard that holds a
// part of it (each range verified, together covering it exactly once). Only that parameter is held in
// memory, allocated after the shards' real sizes were checked.
absl::StatusOr<std::vector<float>> ReadMasterParam(const std::string& step_dir, const Manifest& m, size_t unit,
                                                   size_t param);

struct VerifyReport {
  uint64_t files = 0, ranges = 0, bytes = 0;
};
// Checks every shard's size and header checksum against the manifest, every range's checksum, and that
// the ranges of all shards cover every parameter's elements of every state kind exactly once.
absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& step_dir, const Manifest& m);
// The same checks but the range checksums, from the shards' headers alone (no data is read): what an
// export checks before it trusts the manifest's list of parameters.
absl::Status CheckCoverage(const std::string& step_dir, const Manifest& m);

}  // namespace strata::checkpoint
