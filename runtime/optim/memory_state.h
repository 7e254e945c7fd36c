// MemoryState: the optimizer state in memory (device or pinned-host buffers), the StateStore of every
// run without NVMe optimizer state. The buffers are allocated by the engine (in its order, against its
// budgets) and handed over; the master is either its own buffer or the param storage's update range
// (fp32 params with the optimizer beside them: Note [Tier placement] in runtime/engine/placement.h).
// What is done to the bytes is the tiers' own operations (Note [Tier ops] in runtime/memory/tier_ops.h)
// and the optimizer's update over the state's tier (tier_update.h), called directly.
#pragma once

#include <optional>
#include <vector>

#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/state_store.h"
#include "runtime/optim/tier_update.h"

namespace strata::optim {

// One unit's state buffers. `master` is empty when the master is the param storage itself; master_ptr
// is where it is either way. `v` is empty for SGD.
struct MemoryUnit {
  memory::Buffer master, m, v;
  float* master_ptr = nullptr;
  size_t elems = 0;  // the update range
};

class MemoryState : public StateStore {
 public:
  // master_ops: the master's tier (the param storage's when the master is not apart); state_ops: the
  // optimizer's tier (m, v, the gradients), whose update is `update`. master_apart: the master is not the
  // param storage, so fp32 params receive a copy of it. The three must outlive the store.
  MemoryState(memory::TierOps& master_ops, memory::TierOps& state_ops, TierUpdate& update, bool master_apart,
              std::vector<MemoryUnit> units);

  absl::StatusOr<std::vector<float>> Read(int unit, StateKind kind) override;
  absl::Status Write(int unit, StateKind kind, const std::vector<float>& values) override;
  std::optional<absl::Span<float>> Lend(int unit, StateKind kind) override;
  absl::StatusOr<offload::TilePipelineStats> Step(int unit, const OptimizerConfig& cfg, const UnitStep& up) override;

 private:
  // u.m holds the first moment (AdamW exp_avg, SGD momentum), u.v AdamW's exp_avg_sq.
  float* Ptr(int unit, StateKind kind);
  memory::TierOps& OpsOf(StateKind kind) const { return kind == StateKind::kMaster ? master_ops_ : state_ops_; }

  memory::TierOps& master_ops_;
  memory::TierOps& state_ops_;
  TierUpdate& update_;
  bool master_apart_;
  std::vector<MemoryUnit> units_;
};

}  // namespace strata::optim
