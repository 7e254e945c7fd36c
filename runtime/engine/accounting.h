// Note [Memory accounting]. What one rank's engine holds in each tier, from the configuration and the
// units' layouts alone, without allocating anything. The engine's budget check (CheckBudgets, engine.cc)
// is this function's caller, so the bytes it checks before Finalize allocates are these bytes; `strata
// plan` calls the same function for a model and a cluster it does not have. The NVMe figures are the
// capacities the stores are created with (unit_storage.cc sizes them with the same helpers).
//
// Every buffer the engine tracks in its MemoryTracker is here; the trainer's activations are not the
// engine's (the model accounts for them).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/config.h"
#include "runtime/engine/placement.h"
#include "runtime/memory/memory.h"
#include "runtime/shard/layout.h"
#include "runtime/shard/slot_pool.h"

namespace strata::engine {

// One block of the need: its tier, what it is (the budget check's words) and its size.
struct NeedItem {
  memory::Tier tier;
  const char* what;
  uint64_t bytes;
};

struct MemoryNeed {
  uint64_t tier[memory::kNumTiers] = {0, 0, 0};  // device, pinned host, NVMe
  std::vector<NeedItem> items;                   // in the budget check's order; zero-byte items left out
  // Disk the NVMe files preallocate past the NVMe tier's need where the disk has the room: the state's store once
  // more, for the steps over an asynchronous save (Note [NVMe room agreed] in engine.cc). No tier counts it.
  uint64_t nvme_room = 0;
};

// Where the run executes, as far as memory is concerned: device memory the CPU reaches directly (host
// devices: the device tier is host memory) or not (CUDA: a reduction in device memory is staged to the
// pinned host tier when the optimizer lives there).
struct AccountingTarget {
  bool device_host_visible = true;
};

// The engine's two slot pools (Note [Slot sizing] in shard/slot_pool.h): the gathered parameters of every
// unit, `live` (LiveGatheredUnits) at a time, and the gradient working buffers of the trainable units,
// strata.max_live_units at a time. `elems[i]` and `frozen[i]` are unit i's total elements and whether it is
// frozen (Note [Frozen units]: no gradient buffer). Finalize creates the pools from these plans.
struct PoolPlans {
  shard::SlotPlan gathered, grads;
};
PoolPlans PlanPools(const EngineConfig& cfg, int live, const std::vector<size_t>& elems,
                    const std::vector<bool>& frozen);

// The units as the engine lays them out (layouts built for the shard group's size) and what this rank
// holds of each (DecideExtents). `extents[i]` belongs to `layouts[i]`.
MemoryNeed EngineMemoryNeed(const EngineConfig& cfg, const std::vector<shard::UnitLayout>& layouts,
                            const std::vector<UnitExtents>& extents, const AccountingTarget& target);

}  // namespace strata::engine
