// `strata plan`'s memory: the engine's accounting over the model's units, and the trainer's workspace.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/shard/layout.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_units.h"

namespace strata::tools::plan {

int ShardGroup(const PlanInput& in) { return in.shard_group > 0 ? in.shard_group : in.ranks; }

absl::StatusOr<std::vector<shard::UnitLayout>> Layouts(const PlanInput& in) {
  std::vector<shard::UnitLayout> layouts;
  for (spec::UnitSpec& u : in.model->Units()) {
    STRATA_ASSIGN_OR_RETURN(shard::UnitLayout l,
                            shard::UnitLayout::Build(std::move(u.name), std::move(u.params), ShardGroup(in)));
    layouts.push_back(std::move(l));
  }
  return layouts;
}

absl::StatusOr<EngineLayout> LayOutEngine(const PlanInput& in) {
  EngineLayout e;
  STRATA_ASSIGN_OR_RETURN(std::vector<shard::UnitLayout> layouts, Layouts(in));
  std::vector<engine::UnitExtents> extents;
  for (const shard::UnitLayout& l : layouts) {
    // Every rank of a group holds as much; rank 0's extents stand for all.
    extents.push_back(engine::DecideExtents(in.engine.stage, 0, l));
    e.largest_unit_elems = std::max(e.largest_unit_elems, l.total_elems);
  }
  e.need = engine::EngineMemoryNeed(in.engine, layouts, extents, engine::AccountingTarget{!in.device.gpu});
  return e;
}

absl::StatusOr<MemoryPlan> PlanMemory(const PlanInput& in) {
  STRATA_ASSIGN_OR_RETURN(const EngineLayout e, LayOutEngine(in));
  return MemoryAt(in, e, in.engine.train_micro_batch_size_per_gpu);
}

MemoryPlan MemoryAt(const PlanInput& in, const EngineLayout& e, int B) {
  MemoryPlan p;
  p.engine = e.need;
  p.activations =
      in.model->ActivationBytes(B, in.checkpointing, spec::ComputeTarget{in.device.gpu, in.engine.param_dtype});
  p.unit_copy = in.model->UnitCopyBytes(in.engine.param_dtype, e.largest_unit_elems);
  for (int t = 0; t < memory::kNumTiers; ++t) p.tier[t] = p.engine.tier[t];
  const uint64_t trainer = p.activations + p.unit_copy;
  if (in.device.gpu) {
    p.tier[0] += trainer;  // the CUDA back-end allocates the workspace in device memory
  } else {
    p.host_resident = trainer;
  }
  // The fit: the device beside its reserve, the node's host memory shared by its ranks, and the budgets
  // the engine itself would refuse to exceed (CheckBudgets).
  const uint64_t device_cap = in.device.memory_bytes > in.device.reserved_bytes
                                  ? in.device.memory_bytes - in.device.reserved_bytes
                                  : memory::kUnlimited;
  const uint64_t host_cap = in.device.host_bytes_per_node > 0
                                ? in.device.host_bytes_per_node / std::max(1, in.ranks_per_node)
                                : memory::kUnlimited;
  auto check = [&](const char* tier, uint64_t need, uint64_t cap, const char* what) {
    if (!p.why_not.empty() || need <= cap) return;
    p.why_not = absl::StrCat("tier '", tier, "' needs ", FormatBytes(need), " per rank but ", what, " holds ",
                             FormatBytes(cap));
  };
  check("device", p.tier[0], device_cap, "the device (less its reserve)");
  check("device", p.engine.tier[0], in.engine.device_budget_bytes, "strata.device_budget");
  check("pinned_host", p.tier[1], host_cap, "the node's host memory per rank");
  check("pinned_host", p.tier[1], in.engine.host_budget_bytes, "strata.host_budget");
  p.fits = p.why_not.empty();
  return p;
}

}  // namespace strata::tools::plan
