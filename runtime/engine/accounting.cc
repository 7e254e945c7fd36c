#include "runtime/engine/accounting.h"

#include <algorithm>

#include "runtime/offload/nvme_store.h"
#include "runtime/optim/nvme_state.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/state_kind.h"

namespace strata::engine {

namespace {

// The sizes of the engine-wide buffers (what Finalize's SetUp* functions allocate), from the pools' plans,
// the largest shard and the largest update range. `trained_shard` is the largest trainable shard, which
// sizes the reduce-scatter's scratch (frozen units have none: Note [Frozen units] in placement.h).
SharedSizes SharedSizesOf(const EngineConfig& cfg, int live, const PoolPlans& pools, size_t largest_shard,
                          size_t trained_shard, size_t tile_elems, const AccountingTarget& target) {
  const uint64_t param_bytes = DTypeBytes(cfg.param_dtype);
  const bool optimizer_on_device = cfg.offload_optimizer.device == OffloadDevice::kNone;
  SharedSizes s;
  s.nvme_staging = uint64_t(NvmeStagingTiles(cfg)) * tile_elems * 4;
  s.nvme_param_buffers = NvmeParamBuffers(cfg, live) * offload::NvmeStore::IoBytes(largest_shard * param_bytes);
  s.gathered = pools.gathered.elems() * param_bytes;
  s.grad_buffers = pools.grads.elems() * 4 + trained_shard * 4;
  // Note [Tier placement]: reduced in device memory the CPU cannot reach, the shards on the host.
  const bool staging = cfg.stage >= 2 && !target.device_host_visible && !optimizer_on_device;
  s.grad_staging = staging ? uint64_t(trained_shard) * 4 : 0;
  return s;
}

}  // namespace

PoolPlans PlanPools(const EngineConfig& cfg, int live, const std::vector<size_t>& elems,
                    const std::vector<bool>& frozen) {
  std::vector<shard::SlotUnit> all, trained;
  for (size_t i = 0; i < elems.size(); ++i) {
    all.push_back({static_cast<int>(i), elems[i]});
    if (!frozen[i]) trained.push_back({static_cast<int>(i), elems[i]});
  }
  return PoolPlans{shard::PlanSlots(std::move(all), live), shard::PlanSlots(std::move(trained), cfg.max_live_units)};
}

MemoryNeed EngineMemoryNeed(const EngineConfig& cfg, const std::vector<shard::UnitLayout>& layouts,
                            const std::vector<UnitExtents>& extents, const AccountingTarget& target) {
  // Stand-ins for the two tiers: DecidePlacement and SharedBuffers name tiers by their allocators, and
  // an allocator that is never asked for bytes costs nothing.
  memory::HostAllocator device(memory::Tier::kDevice, memory::kUnlimited, nullptr);
  memory::HostAllocator host(memory::Tier::kPinnedHost, memory::kUnlimited, nullptr);
  const Placement at = DecidePlacement(cfg, &device, &host);
  const uint64_t param_bytes = DTypeBytes(cfg.param_dtype);
  const uint64_t state_buffers = optim::StateBuffers(cfg.optimizer);
  size_t largest_shard = 0, trained_shard = 0, largest_update = 0;
  uint64_t params = 0, master = 0, grads = 0, state = 0, nvme_params = 0;
  std::vector<size_t> update_elems, unit_elems;
  std::vector<bool> frozen;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const UnitExtents& e = extents[i];
    unit_elems.push_back(layouts[i].total_elems);
    frozen.push_back(e.frozen);
    largest_shard = std::max(largest_shard, layouts[i].shard_elems);
    params += e.param_elems * param_bytes;
    nvme_params += offload::NvmeStore::IoBytes(std::max<uint64_t>(layouts[i].shard_elems * param_bytes, 1));
    if (e.frozen) {  // its params alone (Note [Frozen units])
      update_elems.push_back(0);
      continue;
    }
    trained_shard = std::max(trained_shard, layouts[i].shard_elems);
    largest_update = std::max(largest_update, e.update_elems);
    update_elems.push_back(e.update_elems);
    master += e.update_elems * 4;
    grads += e.grad_elems * 4;
    state += e.update_elems * 4 * state_buffers;
  }
  const int live = LiveGatheredUnits(cfg, static_cast<int>(layouts.size()));
  const size_t tile_elems = NvmeTileElems(cfg, largest_update);
  const PoolPlans pools = PlanPools(cfg, live, unit_elems, frozen);
  const SharedSizes sizes = SharedSizesOf(cfg, live, pools, largest_shard, trained_shard, tile_elems, target);
  const std::vector<SharedBuffer> shared = SharedBuffers(cfg, sizes, &device, &host);

  MemoryNeed need;
  auto add = [&](const memory::Allocator* a, uint64_t bytes, const char* what) {
    if (a == nullptr || bytes == 0) return;  // a kind without a tier is not in memory (Note [Placement])
    need.items.push_back({a->tier(), what, bytes});
    need.tier[static_cast<int>(a->tier())] += bytes;
  };
  for (const SharedBuffer& b : shared) {
    if (b.before_units) add(b.tier, b.bytes, b.what);
  }
  add(at.params, params, "parameters");
  add(at.master, master, "fp32 master");
  add(at.grad_shards ? at.grads : nullptr, grads, "gradients");  // none with strata.optimizer_in_backward
  add(at.state, state, "optimizer state");
  for (const SharedBuffer& b : shared) {
    if (!b.before_units) add(b.tier, b.bytes, b.what);
  }
  // The NVMe stores hold the extents these helpers size (unit_storage.cc).
  auto add_nvme = [&](uint64_t bytes, const char* what) {
    if (bytes == 0) return;
    need.items.push_back({memory::Tier::kNvme, what, bytes});
    need.tier[static_cast<int>(memory::Tier::kNvme)] += bytes;
  };
  if (cfg.offload_param.device == OffloadDevice::kNvme) add_nvme(nvme_params, "NVMe parameter shards");
  if (cfg.offload_optimizer.device == OffloadDevice::kNvme) {
    const size_t kinds = optim::StateKinds(cfg.optimizer.type).size();
    const uint64_t state_store = optim::NvmeState::StoreBytes(tile_elems, kinds, update_elems);
    add_nvme(state_store, "NVMe master and optimizer state");
    need.nvme_room = state_store;  // UnitStorage::SetUpNvme grows the store to twice it
  }
  return need;
}

}  // namespace strata::engine
