#include "runtime/engine/placement.h"

#include <cstdint>

namespace strata::engine {

Placement DecidePlacement(const EngineConfig& cfg, memory::Allocator* device, memory::Allocator* host) {
  const bool nvme_params = cfg.offload_param.device == OffloadDevice::kNvme;
  const bool nvme_state = cfg.offload_optimizer.device == OffloadDevice::kNvme;
  memory::Allocator* optimizer = cfg.offload_optimizer.device == OffloadDevice::kNone ? device : host;
  Placement p;
  p.master_apart =
      cfg.param_dtype != DType::kF32 || cfg.offload_optimizer.device != OffloadDevice::kNone || nvme_params;
  p.params = nvme_params ? nullptr : cfg.offload_param.device == OffloadDevice::kNone ? device : host;
  p.master = p.master_apart && !nvme_state ? optimizer : nullptr;
  p.grads = optimizer;
  p.grad_shards = !cfg.optimizer_in_backward;
  p.state = nvme_state ? nullptr : optimizer;
  return p;
}

UnitExtents DecideExtents(int stage, int rank, const shard::UnitLayout& layout) {
  // Which buffers hold only the rank's shard: params from stage 3, gradients from 2, the update from 1.
  const bool sharded_params = stage == 3, sharded_grads = stage >= 2, sharded_update = stage >= 1;
  const size_t shard_begin = static_cast<size_t>(rank) * layout.shard_elems;
  auto extent = [&](bool sharded, size_t* begin, size_t* elems) {
    *begin = sharded ? shard_begin : 0;
    *elems = sharded ? layout.shard_elems : layout.total_elems;
  };
  UnitExtents e;
  extent(sharded_params, &e.param_begin, &e.param_elems);
  extent(sharded_grads, &e.grad_begin, &e.grad_elems);
  extent(sharded_update, &e.update_begin, &e.update_elems);
  e.update_segments = sharded_update ? layout.ShardSegments(rank) : layout.FullSegments();
  if (layout.frozen()) {  // nothing to reduce or update; the owned range stays (Note [Frozen units])
    e.frozen = true;
    e.grad_elems = 0;
    e.update_segments.clear();
  }
  return e;
}

std::vector<SharedBuffer> SharedBuffers(const EngineConfig& cfg, const SharedSizes& bytes, memory::Allocator* device,
                                        memory::Allocator* host) {
  std::vector<SharedBuffer> out;
  // NVMe space itself is checked by the stores; their pinned buffers are host memory.
  if (cfg.offload_optimizer.device == OffloadDevice::kNvme) {
    out.push_back({host, bytes.nvme_staging, "NVMe staging buffers", true});
  }
  if (cfg.offload_param.device == OffloadDevice::kNvme) {
    out.push_back({host, bytes.nvme_param_buffers, "NVMe parameter buffers", true});
  }
  if (cfg.stage == 3) out.push_back({device, bytes.gathered, "gathered units", false});
  if (cfg.stage >= 2) out.push_back({device, bytes.grad_buffers, "gradient buffers", false});
  out.push_back({host, bytes.grad_staging, "gradient staging", false});
  return out;
}

}  // namespace strata::engine
