#include "runtime/optim/nvme_state.h"

#include <algorithm>
#include <cstring>

#include "runtime/base/status.h"

namespace strata::optim {

namespace {
size_t TilesOf(size_t elems, size_t tile_elems) { return (elems + tile_elems - 1) / tile_elems; }
size_t ElemsOf(size_t elems, size_t tile_elems, size_t t) { return std::min(tile_elems, elems - t * tile_elems); }
}  // namespace

uint64_t NvmeState::StoreBytes(size_t tile_elems, size_t kinds, const std::vector<size_t>& update_elems) {
  uint64_t need = 0;
  for (size_t elems : update_elems) {
    for (size_t t = 0; t < TilesOf(elems, tile_elems); ++t) {
      need += kinds * offload::NvmeStore::IoBytes(ElemsOf(elems, tile_elems, t) * 4);
    }
  }
  return need;
}

size_t NvmeState::TileElems(int unit, size_t t) const { return ElemsOf(elems_[unit], tile_elems_, t); }

absl::StatusOr<std::unique_ptr<NvmeState>> NvmeState::Create(std::unique_ptr<offload::NvmeStore> store,
                                                             std::unique_ptr<offload::PinnedPool> staging,
                                                             size_t tile_elems, std::vector<StateKind> kinds,
                                                             std::vector<size_t> update_elems) {
  std::unique_ptr<NvmeState> s(new NvmeState());
  s->store_ = std::move(store);
  s->staging_ = std::move(staging);
  s->tile_elems_ = tile_elems;
  s->elems_ = std::move(update_elems);
  s->lanes_.resize(s->elems_.size());
  for (size_t u = 0; u < s->elems_.size(); ++u) {
    s->lanes_[u].assign(kinds.size(), {});
    for (StateKind k : kinds) {
      const memory::Kind kind = k == StateKind::kMaster ? memory::Kind::kMaster : memory::Kind::kOptimizerState;
      for (size_t t = 0; t < TilesOf(s->elems_[u], tile_elems); ++t) {
        STRATA_ASSIGN_OR_RETURN(offload::NvmeExtent e, s->store_->Allocate(s->TileElems(u, t) * 4, kind));
        s->lanes_[u][StateIndex(k)].push_back(std::move(e));
      }
    }
    // Memory tiers hand out zeroed memory; NVMe does not.
    const std::vector<float> zeros(s->elems_[u], 0.0f);
    for (StateKind k : kinds) {
      if (k != StateKind::kMaster) STRATA_RETURN_IF_ERROR(s->Write(static_cast<int>(u), k, zeros));
    }
  }
  return s;
}

absl::StatusOr<std::vector<float>> NvmeState::Read(int unit, StateKind kind) {
  std::vector<float> out(elems_[unit]);
  offload::PinnedBuffer buf = staging_->Acquire();
  const auto& lane = lanes_[unit][StateIndex(kind)];
  for (size_t t = 0; t < lane.size(); ++t) {
    STRATA_RETURN_IF_ERROR(store_->Read(lane[t], buf.view()).Wait());
    std::memcpy(out.data() + t * tile_elems_, buf.data(), TileElems(unit, t) * 4);
  }
  return out;
}

absl::Status NvmeState::Write(int unit, StateKind kind, const std::vector<float>& values) {
  offload::PinnedBuffer buf = staging_->Acquire();
  const auto& lane = lanes_[unit][StateIndex(kind)];
  for (size_t t = 0; t < lane.size(); ++t) {
    std::memcpy(buf.data(), values.data() + t * tile_elems_, TileElems(unit, t) * 4);
    STRATA_RETURN_IF_ERROR(store_->Write(lane[t], buf.view()).Wait());
  }
  return absl::OkStatus();
}

absl::StatusOr<offload::TilePipelineStats> NvmeState::Update(int unit, const OptimizerConfig& cfg,
                                                             const TiledUpdate& up) {
  std::vector<offload::TileLane> tiles(lanes_[unit].size());  // in StateIndex order
  for (size_t l = 0; l < tiles.size(); ++l) {
    for (const offload::NvmeExtent& e : lanes_[unit][l]) tiles[l].tiles.push_back(&e);
  }
  const size_t param_bytes = DTypeBytes(up.param_dtype);
  auto update_tile = [&](size_t t, absl::Span<const memory::BufferView> v) -> absl::Status {
    const size_t lo = t * tile_elems_, hi = lo + TileElems(unit, t);
    std::vector<shard::Segment> segs;
    for (const shard::Segment& s : *up.segments) {
      const size_t b = std::max(lo, s.begin), e = std::min(hi, s.end);
      if (b >= e) continue;
      shard::Segment in_tile = s;  // its param, flag, step and group; the run clipped to the tile
      in_tile.begin = b - lo;
      in_tile.end = e - lo;
      segs.push_back(in_tile);
    }
    ShardState st{v[0].as<float>(), up.grad + lo, v[1].as<float>(), v.size() > 2 ? v[2].as<float>() : nullptr};
    UpdateOptions opts;
    opts.executor = up.executor;
    char* dst = up.params + lo * param_bytes;
    if (up.param_dtype != DType::kF32) {
      opts.param_copy = reinterpret_cast<uint16_t*>(dst);
      opts.param_copy_dtype = up.param_dtype;
    }
    ApplyUpdate(cfg, st, segs, up.groups, up.step, up.clip_coef, opts);
    if (up.param_dtype == DType::kF32) std::memcpy(dst, v[0].data, (hi - lo) * 4);
    return absl::OkStatus();
  };
  // optim/ drives the pipeline and updates each tile itself (calls only descend: offload/ calls nothing back).
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::TiledPipeline> pipeline,
                          offload::TiledPipeline::Start(*store_, *staging_, tiles));
  while (pipeline->Next()) pipeline->Done(update_tile(pipeline->tile(), pipeline->views()));
  return pipeline->Finish();
}

absl::StatusOr<offload::TilePipelineStats> NvmeState::Step(int unit, const OptimizerConfig& cfg, const UnitStep& up) {
  offload::TilePipelineStats stats;
  STRATA_RETURN_IF_ERROR(WriteParamsOnHost(up.params, [&](char* params) -> absl::Status {
    const TiledUpdate tiled{up.grad,   up.segments, params,       up.param_dtype,
                            up.groups, up.step,     up.clip_coef, up.executor};
    STRATA_ASSIGN_OR_RETURN(stats, Update(unit, cfg, tiled));
    return absl::OkStatus();
  }));
  return stats;
}

}  // namespace strata::optim
