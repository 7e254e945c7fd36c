// The checkpoint manifest: a versioned JSON file naming everything needed to continue a run exactly
// (docs/design.md "Checkpoints"). It is written last, after every shard is durable; a step directory without
// it is incomplete and is never loaded.
//
// A manifest comes from other people and machines (docs/design.md "External input is hostile until validated"):
// ParseManifest checks every field's presence, type and range, and the fields against each other, in one
// pass before anything is trusted, and never throws or aborts on any input (the fuzzers call it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/step_dirs.h"

namespace strata::checkpoint {

// The newest format this strata reads. A manifest is written in the oldest format that holds it, so a
// checkpoint that an older strata can load stays loadable there: format 1 unless a parameter is frozen.
inline constexpr int kManifestVersion = 4;
inline constexpr int kFrozenManifestVersion = 2;   // parameters may be "frozen": true
inline constexpr int kSkippedManifestVersion = 3;  // parameters may have "skipped_steps": N
inline constexpr int kOwnHyperManifestVersion = 4;  // parameters may have "own_lr" / "own_weight_decay": x
inline constexpr char kManifestName[] = "manifest.json";
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
inline constexpr int kMaxWorldSize = 1 << 20;

struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // global element offset in the unit's flat buffer
  uint64_t numel = 0;
  bool weight_decay = false;
  // Frozen (format 2): only its "master" kind is saved, the parameter's values, never updated. Absent in
  // the JSON when false, so a manifest without frozen parameters is the format-1 document.
  bool frozen = false;
  // Steps whose update skipped this parameter (format 3; strata.params_without_grad "skip": it had no
  // gradient), so its own step count is step - skipped_steps. Absent in the JSON when 0.
  int64_t skipped_steps = 0;
  // The parameter's own lr and weight decay, a param group's (format 4; shard::ParamSpec::own_lr /
  // own_weight_decay, Note [Param groups]): absent in the JSON when unset (the config's), so a manifest without
  // them is the document of the format before.
  std::optional<double> own_lr;
  std::optional<double> own_weight_decay;
};

struct ManifestUnit {
  std::string name;
  std::vector<ManifestParam> params;
};

struct ManifestShard {
  int rank = 0;
  std::string file;  // one plain name inside the step directory (Note [Confined names] in files.h)
  uint64_t bytes = 0;
  uint32_t checksum = 0;
};

struct Manifest {
  int version = 1;  // the format written (kFrozenManifestVersion with frozen parameters)
  int64_t step = 0;
  int world_size = 1;  // the ranks the state was sharded over, one shard file each: the shard group's G
  // The job's copies of that state (hybrid sharding: N / G; only one shard group wrote). Absent = 1.
  int replicas = 1;
  int stage = 0;
  std::string param_dtype;  // "fp32" / "bf16" / "fp16"
  std::string optimizer;    // "adamw" / "sgd"
  float loss_scale = 1;
  int clean_steps = 0;
  // fp16 hysteresis left (Note [Dynamic loss scale]); 0 = not recorded (older checkpoints): the configured one.
  int loss_scale_hysteresis = 0;
  std::vector<ManifestUnit> units;
  std::vector<ManifestShard> shards;
  std::string trainer_json = "{}";  // the trainer's own state (data position, model shape, ...), opaque here
};

// The names (optim::StateKindName) of the fp32 state kinds optimizer `optimizer` ("adamw" / "sgd") saves
// per element, in optim::StateKinds order: "master" first, then its moments.
std::vector<std::string> StateKinds(absl::string_view optimizer);
// The kinds saved for one parameter: StateKinds(optimizer), or "master" alone when it is frozen.
std::vector<std::string> StateKinds(absl::string_view optimizer, const ManifestParam& p);

// OK when `trainer_json` is a JSON document a manifest can hold (nesting under kMaxJsonDepth levels);
// otherwise InvalidArgument saying why. SaveCheckpoint checks it before writing anything.
absl::Status CheckTrainerState(absl::string_view trainer_json);

std::string ToJson(const Manifest& m);
// Parses and validates `text` (`path` only names it in errors). Checked: JSON nesting (kMaxJsonDepth),
// every field's type and range; dtype and optimizer names; each parameter's numel equals the product of
// its shape, parameters of a unit do not overlap, sizes computed with overflow checks, and the state they
// need fits in the bytes the shards declare; the shards name each rank 0..world_size-1 exactly once
// (returned sorted by rank) with distinct, plain file names. Errors are DataLoss / InvalidArgument naming
// the file and the field; a newer version is FailedPrecondition naming both versions. Never aborts.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view path = kManifestName);

}  // namespace strata::checkpoint
