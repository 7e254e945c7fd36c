// The checkpoint manifest: a versioned JSON file naming everything needed to continue a run exactly
// (DESIGN "Checkpoints"). It is written last, after every shard is durable; a step directory without
// it is incomplete and is never loaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::checkpoint {

inline constexpr int kManifestVersion = 1;
inline constexpr char kManifestName[] = "manifest.json";

struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // global element offset in the unit's flat buffer
  uint64_t numel = 0;
  bool weight_decay = false;
};

struct ManifestUnit {
  std::string name;
  std::vector<ManifestParam> params;
};

struct ManifestShard {
  int rank = 0;
  std::string file;  // relative to the step directory
  uint64_t bytes = 0;
  uint32_t checksum = 0;
};

struct Manifest {
  int version = kManifestVersion;
  int64_t step = 0;
  int world_size = 1;
  int stage = 0;
  std::string param_dtype;  // "fp32" / "bf16" / "fp16"
  std::string optimizer;    // "adamw" / "sgd"
  float loss_scale = 1;
  int clean_steps = 0;
  std::vector<ManifestUnit> units;
  std::vector<ManifestShard> shards;
  std::string trainer_json = "{}";  // the trainer's own state (data position, model shape, ...), opaque here
};

std::string ToJson(const Manifest& m);
// Parses and checks the format; a newer version is FailedPrecondition naming both versions.
absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& path);

// "step_00000020"
std::string StepDirName(int64_t step);
// The step directory to load from `path`: the path itself when it holds a manifest, else the complete
// step directory with the highest step under it. NotFound naming the path when there is none.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);
// Complete step directories under `dir`, oldest first.
std::vector<std::string> CompleteSteps(const std::string& dir);

}  // namespace strata::checkpoint
