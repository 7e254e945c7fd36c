// NvmeState: the fp32 master and the optimizer state of every unit on NVMe, in tiles (Note [NVMe state]
// below), and the update over them. Every kind of a unit is one lane of
// extents, lane order optim::StateIndex; tile t of every lane covers the same elements
// [t * tile_elems, ...) of the unit's update range. The update streams the tiles through the pinned
// staging pool with offload::TiledPipeline (read tile t+1 and write tile t-1 while tile t updates).
// Read / Write stage one kind of one unit at a time, for export, SetParam, checkpoints and restores.
//
// Note [NVMe state]. With offload_optimizer = nvme the fp32 master and the optimizer state of each unit
// live on NVMe in tiles of NvmeTileElems (every lane's tile i covers the same elements); the step
// streams them through pinned buffers with offload::TiledPipeline (read tile i+1 and write tile
// i-1 while tile i updates). Gradients stay on the pinned-host tier. Anything that needs the master in
// memory (export, SetParam, checkpoints) stages one unit at a time. The tiles are NvmeState's, below.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"
#include "runtime/offload/tiled_pipeline.h"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/state_kind.h"
#include "runtime/optim/state_store.h"
#include "runtime/shard/layout.h"

namespace strata::optim {

// One unit's update: its gradients and segments over the update range, where the updated params go
// (`params`, the update range of the param storage in `param_dtype`) and the step's scalars.
struct TiledUpdate {
  const float* grad = nullptr;
  const std::vector<shard::Segment>* segments = nullptr;  // relative to the update range's start
  char* params = nullptr;
  DType param_dtype = DType::kF32;
  absl::Span<const GroupHyper> groups;  // each param group's lr and decay (Note [Param groups]), by Segment::group
  int64_t step = 0;  // 1-based, as ApplyUpdate takes it
  float clip_coef = 1;
  HostExecutor* executor = nullptr;  // same bits for every thread count
};

class NvmeState : public StateStore {
 public:
  // NVMe bytes the lanes of units with these update ranges take (the store's capacity).
  static uint64_t StoreBytes(size_t tile_elems, size_t kinds, const std::vector<size_t>& update_elems);
  // Allocates every unit's lanes on `store` and zeroes every kind but the master (which the caller
  // writes). `staging` holds buffers of tile_elems fp32 each.
  static absl::StatusOr<std::unique_ptr<NvmeState>> Create(std::unique_ptr<offload::NvmeStore> store,
                                                          std::unique_ptr<offload::PinnedPool> staging,
                                                          size_t tile_elems, std::vector<StateKind> kinds,
                                                          std::vector<size_t> update_elems);

  absl::StatusOr<std::vector<float>> Read(int unit, StateKind kind) override;
  absl::Status Write(int unit, StateKind kind, const std::vector<float>& values) override;
  // The optimizer step of one unit (cfg.type's kinds), tile by tile; the params receive the update
  // range rounded to param_dtype (or copied, fp32).
  absl::StatusOr<offload::TilePipelineStats> Update(int unit, const OptimizerConfig& cfg, const TiledUpdate& u);
  // StateStore's step: Update over the params in host memory (the tiles cover the whole update range).
  absl::StatusOr<offload::TilePipelineStats> Step(int unit, const OptimizerConfig& cfg, const UnitStep& up) override;

 private:
  NvmeState() = default;
  size_t Tiles(int unit) const { return lanes_[unit].empty() ? 0 : lanes_[unit][0].size(); }
  size_t TileElems(int unit, size_t t) const;

  std::unique_ptr<offload::NvmeStore> store_;
  std::unique_ptr<offload::PinnedPool> staging_;
  size_t tile_elems_ = 0;
  std::vector<size_t> elems_;  // per unit: the update range's elements
  std::vector<std::vector<std::vector<offload::NvmeExtent>>> lanes_;  // unit, StateIndex, tile
};

}  // namespace strata::optim
