// Internal to `strata plan`: the pieces plan_memory.cc and plan_time.cc share.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/shard/layout.h"
#include "tools/plan/plan.h"

namespace strata::tools::plan {

// G, resolved (0 in the input means every rank).
int ShardGroup(const PlanInput& in);
// The model's units laid out for a shard group of G ranks (a world of G, for the layout).
absl::StatusOr<std::vector<shard::UnitLayout>> Layouts(const PlanInput& in);
// What the engine holds (it does not depend on the micro-batch), and the largest unit.
struct EngineLayout {
  engine::MemoryNeed need;
  size_t largest_unit_elems = 0;
};
absl::StatusOr<EngineLayout> LayOutEngine(const PlanInput& in);
// The memory plan at micro-batch B over the engine's part.
MemoryPlan MemoryAt(const PlanInput& in, const EngineLayout& e, int B);

}  // namespace strata::tools::plan
