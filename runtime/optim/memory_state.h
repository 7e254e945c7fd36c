// MemoryState: the optimizer state in memory (device or pinned-host buffers), the StateStore of every
// run without NVMe optimizer state. The buffers are allocated by the engine (in its order, against its
// budgets) and handed over; the master is either its own buffer or the param storage's update range
// (fp32 params with the optimizer beside them: Note [Tier placement] in runtime/engine/engine_impl.h).
// What is done to the bytes reaches this layer as function objects over the tier's operations (the
// engine's TierOps), as the gather's and the reduction's do in shard/.
#pragma once

#include <functional>
#include <vector>

#include "runtime/memory/memory.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/state_store.h"

namespace strata::optim {

// The operations of the memory one part of the state lives in (all pointers on that tier; blocking).
struct MemoryOps {
  bool host_visible = true;  // the CPU reads and writes the pointers directly
  std::function<absl::Status(void* host, const void* src, size_t bytes)> to_host;
  std::function<absl::Status(void* dst, const void* host, size_t bytes)> from_host;
  // ApplyUpdate over segs; param_copy (may be null) receives the updated master in copy_dtype.
  std::function<absl::Status(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                             absl::Span<const GroupHyper> groups, int64_t step, float grad_scale, uint16_t* param_copy,
                             DType copy_dtype)>
      update;
  // dst[i] = src[i] in `to` (kF32: a copy).
  std::function<absl::Status(DType to, const float* src, void* dst, size_t n)> cast;
};

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
  // optimizer's tier (m, v, the gradients and the update). master_apart: the master is not the param
  // storage, so fp32 params receive a copy of it.
  MemoryState(MemoryOps master_ops, MemoryOps state_ops, bool master_apart, std::vector<MemoryUnit> units);

  absl::StatusOr<std::vector<float>> Read(int unit, StateKind kind) override;
  absl::Status Write(int unit, StateKind kind, const std::vector<float>& values) override;
  absl::Status Edit(int unit, StateKind kind, const std::function<void(float*)>& fn, bool write_back) override;
  absl::StatusOr<offload::TilePipelineStats> Step(int unit, const OptimizerConfig& cfg, const UnitStep& up) override;

 private:
  // u.m holds the first moment (AdamW exp_avg, SGD momentum), u.v AdamW's exp_avg_sq.
  float* Ptr(int unit, StateKind kind);
  const MemoryOps& OpsOf(StateKind kind) const { return kind == StateKind::kMaster ? master_ops_ : state_ops_; }

  MemoryOps master_ops_, state_ops_;
  bool master_apart_;
  std::vector<MemoryUnit> units_;
};

}  // namespace strata::optim
