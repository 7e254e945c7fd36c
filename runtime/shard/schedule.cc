#include "runtime/shard/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::shard {

std::string Schedule::Name(Phase phase, int unit) const {
  const std::string n = unit >= 0 && unit < static_cast<int>(names_.size()) ? names_[unit] : "?";
  return absl::StrCat(phase == Phase::kForward ? "forward" : "backward", " of unit '", n, "'");
}

absl::Status Schedule::Observe(Phase phase, int unit) {
  ++pos_;
  if (!frozen_) {
    uses_.push_back(Use{phase, unit});
    return absl::OkStatus();
  }
  if (pos_ >= static_cast<int>(uses_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unit order differs from the recorded one: micro-batch ", micro_batches_, " has an extra ",
        Name(phase, unit), " after the ", uses_.size(), " uses recorded on the first micro-batch"));
  }
  const Use& want = uses_[pos_];
  if (want.phase != phase || want.unit != unit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unit order differs from the recorded one: use #", pos_, " of micro-batch ", micro_batches_, " is the ",
        Name(phase, unit), ", but the first micro-batch had the ", Name(want.phase, want.unit),
        " there; every micro-batch must use units in the same order on every rank, as the first did (each use "
        "gathers or reduces its unit with every rank). Put a module that runs in some steps or on some ranks only "
        "into a unit that every micro-batch runs, such as the root unit (strata.torch: unit_classes that exclude "
        "it), or make every micro-batch take the same path (docs/decisions/0024-agreed-schedule.md)"));
  }
  return absl::OkStatus();
}

absl::Status Schedule::EndMicroBatch() {
  const int used = pos_ + 1;
  pos_ = -1;
  ++micro_batches_;
  if (!frozen_) {
    frozen_ = true;
    return absl::OkStatus();
  }
  if (used != static_cast<int>(uses_.size())) {
    const Use& missing = uses_[used];
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", micro_batches_ - 1, " ended after ", used, " of the ", uses_.size(),
        " recorded unit uses; the next expected was the ", Name(missing.phase, missing.unit)));
  }
  return absl::OkStatus();
}

std::vector<int> Schedule::Upcoming(int depth, int current) const {
  std::vector<int> out;
  if (!frozen_) return out;
  for (int i = pos_ + 1; i < static_cast<int>(uses_.size()) && static_cast<int>(out.size()) < depth; ++i) {
    const int u = uses_[i].unit;
    if (u != current && std::find(out.begin(), out.end(), u) == out.end()) out.push_back(u);
  }
  return out;
}

int Schedule::BackwardUsesAfterPosition(int unit) const {
  int n = 0;
  for (int i = pos_ + 1; i < static_cast<int>(uses_.size()); ++i) {
    if (uses_[i].phase == Phase::kBackward && uses_[i].unit == unit) ++n;
  }
  return n;
}

}  // namespace strata::shard
