// The order in which units are used, recorded on the first micro-batch and enforced afterwards.
//
// Prefetch depends on knowing which unit comes next; every rank must also issue its gathers in the same
// order. So the first micro-batch's sequence of (phase, unit) uses is recorded, and every later
// micro-batch must repeat it exactly. A deviation is a FailedPrecondition naming the expected and the
// actual unit and the position, raised before any collective is issued for it, never a hang.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace strata::shard {

enum class Phase { kForward, kBackward };

struct Use {
  Phase phase;
  int unit;
};

class Schedule {
 public:
  explicit Schedule(std::vector<std::string> unit_names) : names_(std::move(unit_names)) {}

  // Called at each Begin{Forward,Backward}; records (first micro-batch) or checks the use.
  absl::Status Observe(Phase phase, int unit);
  // Closes a micro-batch: the first freezes the record; later ones must have used the whole record.
  absl::Status EndMicroBatch();
  // Resets the position for the next micro-batch without closing (used after a failed micro-batch).
  void Rewind() { pos_ = -1; }

  bool recorded() const { return frozen_; }
  int position() const { return pos_; }
  const std::vector<Use>& uses() const { return uses_; }
  // Up to `depth` distinct units used after the current position (this micro-batch only), in order,
  // excluding `current`. Empty until the record is frozen.
  std::vector<int> Upcoming(int depth, int current) const;
  // Is the use at the current position the last backward use of its unit? (Frozen record only.)
  int BackwardUsesAfterPosition(int unit) const;

 private:
  std::string Name(Phase phase, int unit) const;
  std::vector<std::string> names_;
  std::vector<Use> uses_;
  bool frozen_ = false;
  int pos_ = -1;
  int micro_batches_ = 0;
};

}  // namespace strata::shard
