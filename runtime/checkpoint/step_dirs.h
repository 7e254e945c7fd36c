// Step directories of a checkpoint root: their names, which of them are complete, and their removal
// (keep-last pruning) in an order that never leaves a half-removed checkpoint that still looks complete.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace strata::checkpoint {

// "step_00000020"
std::string StepDirName(int64_t step);
// The step of a directory named by StepDirName ("step_" and decimal digits only); nullopt otherwise.
std::optional<int64_t> ParseStepDirName(absl::string_view name);
// The step directory to load from `path`: the path itself when it holds a manifest, else the complete
// step directory with the highest step under it. NotFound naming the path when there is none.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);
// Complete step directories under `dir` (named by StepDirName, with a manifest that is a regular file),
// in increasing step order.
std::vector<std::string> CompleteSteps(const std::string& dir);

// Removes one path (a file, or a directory with what it holds).
using RemovePathFn = std::function<absl::Status(const std::string& path)>;
absl::Status RemovePath(const std::string& path);
// Removes step directory `step_dir`: its manifest first (then the directory is fsynced, so from here on
// the step is incomplete, even after a crash), then every other entry, then the directory itself.
// `remove` does each removal (tests inject failures through it). Stops at the first error, naming it.
absl::Status RemoveStep(const std::string& step_dir, const RemovePathFn& remove = RemovePath);

}  // namespace strata::checkpoint
