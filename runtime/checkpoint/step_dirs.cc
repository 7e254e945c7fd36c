#include "runtime/checkpoint/step_dirs.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/manifest.h"

namespace strata::checkpoint {

namespace fs = std::filesystem;

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "step_";
  if (name.substr(0, kPrefix.size()) != kPrefix || name.size() == kPrefix.size()) return std::nullopt;
  int64_t step = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(step, 10, &step) || __builtin_add_overflow(step, c - '0', &step)) return std::nullopt;
  }
  return step;
}

// The std::filesystem calls take an error_code: the throwing overloads would abort on a path the
// user gave that cannot be examined (too long, unreadable parent).
// Only names StepDirName could have written count ("step_x", "step_00000004_old" are someone else's), in
// the order of their steps, not of their text (step_100000000 comes after step_99999999), and a step is
// complete only when its manifest is a regular file.
std::vector<std::string> CompleteSteps(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int64_t> step = ParseStepDirName(it->path().filename().string());
    std::error_code entry_ec;
    if (step && it->is_directory(entry_ec) && fs::is_regular_file(it->path() / kManifestName, entry_ec)) {
      found.emplace_back(*step, it->path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifestName, ec)) return path;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path, "' does not exist",
                                            ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  const std::vector<std::string> steps = CompleteSteps(path);
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrCat("no complete checkpoint under '", path,
                                            "' (a step directory is complete once its manifest.json exists)"));
  }
  return steps.back();
}

absl::Status RemovePath(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot remove '", path, "': ", ec.message()));
  return absl::OkStatus();
}

absl::Status RemoveStep(const std::string& step_dir, const RemovePathFn& remove) {
  const auto fail = [&](const absl::Status& s) {
    return Annotate(s, absl::StrCat("removing checkpoint '", step_dir, "'"));
  };
  const fs::path manifest = fs::path(step_dir) / kManifestName;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(manifest, ec))) {
    if (absl::Status s = remove(manifest.string()); !s.ok()) return fail(s);
    if (absl::Status s = FsyncDir(step_dir); !s.ok()) return fail(s);
  }
  std::vector<std::string> rest;
  for (fs::directory_iterator it(step_dir, ec), end; !ec && it != end; it.increment(ec)) {
    rest.push_back(it->path().string());
  }
  if (ec) return fail(absl::PermissionDeniedError(absl::StrCat("cannot list '", step_dir, "': ", ec.message())));
  std::sort(rest.begin(), rest.end());
  for (const std::string& p : rest) {
    if (absl::Status s = remove(p); !s.ok()) return fail(s);
  }
  if (absl::Status s = remove(step_dir); !s.ok()) return fail(s);
  const std::string parent = fs::path(step_dir).parent_path().string();
  return FsyncDir(parent.empty() ? "." : parent);
}

}  // namespace strata::checkpoint
