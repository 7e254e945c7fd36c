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
//
// Note [Snapshots of NVMe state]. (docs/decisions/0046-async-checkpoints-of-nvme-state.md) An asynchronous
// checkpoint must not hold a shard of NVMe state in host memory, so Snapshot(unit, kind) copies nothing: it
// takes a second owner of every tile extent of the lane (NvmeExtent::Share, no I/O). While a snapshot holds
// a tile, nothing writes that extent: the next write of the tile (Update's write-back, Write) goes to a
// fresh extent that then replaces it in the live lane (redirect on write), and the old one, still the
// snapshot's, keeps the bytes it had when the snapshot was taken. The snapshot is read front to back (on the
// checkpoint's writer thread, through one tile of its own staging) and lets go of each tile once it read
// past it; a tile's space returns to the store when its last owner lets go. A tile nobody shares is written
// in place, as before. So the state updated while a save is in flight needs up to twice its bytes on NVMe.
// When the store has no room for a redirect (ResourceExhausted), the write waits until a snapshot lets go
// of a tile (that frees room, or unshares the tile, which is then written in place), and tries again:
// training slows down to the checkpoint's pace, but neither fails nor loses a byte. Nothing else changes:
// the values, and so training, are those of a run without a snapshot. Thread safety: the training thread
// alone changes the lanes; the snapshot's tiles are its own handles; the store's Allocate, Read and the
// extents' release are thread-safe (nvme_store.h), and a shared extent is only ever read.
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

// Note [Frozen units in a snapshot] (engine/unit_storage.cc): `elems` values of `dtype` from element `first`
// of `shard`, an extent of `store` holding a frozen unit's parameter shard (offload::ShardCache::Hold), read as
// floats through a staging buffer of the shard's size; `let_go` is notified when it lets go. Null when the
// range does not lie in the shard.
std::unique_ptr<KindSnapshot> NvmeShardSnapshot(offload::NvmeStore* store, std::shared_ptr<offload::LetGoSignal> let_go,
                                                offload::NvmeExtent shard, size_t first, size_t elems, DType dtype);

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
  // Note [Snapshots of NVMe state]: the lane of `kind` as it is now, without I/O.
  std::unique_ptr<KindSnapshot> Snapshot(int unit, StateKind kind) override;

  // Since Create: tiles written to a fresh extent because a snapshot held them, and waits for a snapshot
  // to let go of a tile because the store had no room for one.
  struct RedirectStats {
    uint64_t redirected_tiles = 0;
    uint64_t waits = 0;
  };
  RedirectStats redirect_stats() const { return redirects_; }

 private:
  NvmeState() = default;
  size_t Tiles(int unit) const { return lanes_[unit].empty() ? 0 : lanes_[unit][0].size(); }
  size_t TileElems(int unit, size_t t) const;
  // Where a write of the tile `live` of lane `lane` goes: an empty extent for in place (nobody else holds
  // it), else a fresh one; waits for snapshots to let go while the store has no room.
  absl::StatusOr<offload::NvmeExtent> WriteTarget(const offload::NvmeExtent& live, size_t lane);

  std::unique_ptr<offload::NvmeStore> store_;
  std::unique_ptr<offload::PinnedPool> staging_;
  size_t tile_elems_ = 0;
  std::vector<size_t> elems_;  // per unit: the update range's elements
  std::vector<std::vector<std::vector<offload::NvmeExtent>>> lanes_;  // unit, StateIndex, tile
  std::shared_ptr<offload::LetGoSignal> let_go_;  // shared with the snapshots, which may outlive nothing but it
  RedirectStats redirects_;
};

}  // namespace strata::optim
