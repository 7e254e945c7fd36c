#include "runtime/optim/nvme_state.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::optim {

namespace {
size_t TilesOf(size_t elems, size_t tile_elems) { return (elems + tile_elems - 1) / tile_elems; }
size_t ElemsOf(size_t elems, size_t tile_elems, size_t t) { return std::min(tile_elems, elems - t * tile_elems); }

// Note [Snapshots of NVMe state]: one lane's tiles, owned with the live lane until either lets go, read
// front to back through one tile of staging of its own (plain aligned memory, allocated on the first read).
// Tile t holds elements [t * tile_elems, ...) of `dtype`; the snapshot's elements start at `first` (a frozen
// unit's update range in its parameter shard: Note [Frozen units in a snapshot] in engine/unit_storage.cc).
class NvmeKindSnapshot : public KindSnapshot {
 public:
  NvmeKindSnapshot(offload::NvmeStore* store, std::shared_ptr<offload::LetGoSignal> let_go, size_t tile_elems,
                   size_t elems, std::vector<offload::NvmeExtent> tiles, DType dtype = DType::kF32, size_t first = 0)
      : store_(store),
        let_go_(std::move(let_go)),
        tile_elems_(tile_elems),
        elems_(elems),
        first_(first),
        dtype_(dtype),
        tiles_(std::move(tiles)) {
    for (const offload::NvmeExtent& e : tiles_) held_ += e.io_bytes();
    free_at_snapshot_ = store_->free_bytes();
  }
  ~NvmeKindSnapshot() override { Release(); }

  size_t elems() const override { return elems_; }
  uint64_t held_bytes() const override { return held_; }
  uint64_t staging_bytes() const override { return offload::NvmeStore::IoBytes(tile_elems_ * DTypeBytes(dtype_)); }

  absl::Status Read(size_t at, size_t n, float* dst) override {
    if (at + n > elems_ || first_ + at < let_go_before_ * tile_elems_) {
      return absl::OutOfRangeError(absl::StrCat("snapshot read of elements [", at, ", ", at + n, ") of ", elems_,
                                                " (read from ", let_go_before_ * tile_elems_ - first_, " on)"));
    }
    const size_t bytes = DTypeBytes(dtype_);
    for (size_t p = first_ + at, end = p + n; p < end;) {
      const size_t t = p / tile_elems_, in = p - t * tile_elems_;
      LetGoBefore(t);
      const size_t take = std::min(end - p, ElemsOf(first_ + elems_, tile_elems_, t) - in);
      if (loaded_ != t) {
        if (staging_ == nullptr) {
          staging_ = static_cast<char*>(std::aligned_alloc(offload::NvmeStore::kAlignment, staging_bytes()));
          if (staging_ == nullptr) return absl::ResourceExhaustedError("no memory for a snapshot's staging tile");
        }
        loaded_ = SIZE_MAX;
        STRATA_RETURN_IF_ERROR(
            store_->Read(tiles_[t], memory::BufferView{staging_, staging_bytes(), memory::Tier::kPinnedHost}).Wait());
        loaded_ = t;
      }
      ReadAsFloats(staging_ + in * bytes, dtype_, take, dst);
      dst += take;
      p += take;
    }
    if (at + n == elems_) LetGoBefore(tiles_.size());
    return absl::OkStatus();
  }

  // Note [Cloned checkpoint lanes]: fp32 tiles of a lane (not a frozen unit's shard, which starts elsewhere).
  std::optional<LaneFiles> Files() const override {
    if (dtype_ != DType::kF32 || first_ != 0) return std::nullopt;
    LaneFiles out;
    out.tile_elems = tile_elems_;
    out.store_free_bytes = free_at_snapshot_;
    for (const offload::NvmeExtent& tile : tiles_) {
      out.crcs.push_back(offload::NvmeStore::Checksum(tile));
      std::vector<LanePiece>& pieces = out.tiles.emplace_back();
      for (offload::ExtentPlacement& p : store_->Placement(tile)) {
        pieces.push_back(LanePiece{std::move(p.path), std::move(p.reopen_path), p.file_offset, p.bytes});
      }
    }
    return out;
  }

  void Skip(size_t at) override { LetGoBefore(at >= elems_ ? tiles_.size() : (first_ + at) / tile_elems_); }

  TileCheck Check(size_t t) const override {
    if (t >= tiles_.size() || tiles_[t].empty()) return {};
    const bool let_go_now = !tiles_[t].shared() || let_go_->waited_on();  // first: a check may land in between
    return {offload::NvmeStore::Checked(tiles_[t]), let_go_now};
  }

  void Release() override {
    LetGoBefore(tiles_.size());
    std::free(staging_);
    staging_ = nullptr;
    loaded_ = SIZE_MAX;
  }

 private:
  // Lets go of tiles [.., t).
  void LetGoBefore(size_t t) {
    if (t <= let_go_before_) return;
    for (size_t i = let_go_before_; i < t; ++i) tiles_[i].Reset();
    let_go_before_ = t;
    let_go_->Notify();
  }

  offload::NvmeStore* store_;
  std::shared_ptr<offload::LetGoSignal> let_go_;
  size_t tile_elems_, elems_, first_;
  DType dtype_;
  std::vector<offload::NvmeExtent> tiles_;
  uint64_t held_ = 0;
  uint64_t free_at_snapshot_ = 0;  // the store's room when the snapshot was taken, before any step over it
  size_t let_go_before_ = 0;       // tiles before it are let go
  size_t loaded_ = SIZE_MAX;       // the tile in staging_
  char* staging_ = nullptr;
};
}  // namespace

std::unique_ptr<KindSnapshot> NvmeShardSnapshot(offload::NvmeStore* store, std::shared_ptr<offload::LetGoSignal> let_go,
                                                offload::NvmeExtent shard, size_t first, size_t elems, DType dtype) {
  const size_t shard_elems = shard.bytes() / DTypeBytes(dtype);
  if (first + elems > shard_elems) return nullptr;
  std::vector<offload::NvmeExtent> tiles;
  tiles.push_back(std::move(shard));
  return std::make_unique<NvmeKindSnapshot>(store, std::move(let_go), shard_elems, elems, std::move(tiles), dtype,
                                            first);
}

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
  s->let_go_ = std::make_shared<offload::LetGoSignal>();
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
  auto& lane = lanes_[unit][StateIndex(kind)];
  for (size_t t = 0; t < lane.size(); ++t) {
    std::memcpy(buf.data(), values.data() + t * tile_elems_, TileElems(unit, t) * 4);
    STRATA_ASSIGN_OR_RETURN(offload::NvmeExtent fresh, WriteTarget(lane[t], StateIndex(kind)));
    STRATA_RETURN_IF_ERROR(store_->Write(fresh.empty() ? lane[t] : fresh, buf.view()).Wait());
    if (!fresh.empty()) lane[t] = std::move(fresh);  // Note [Snapshots of NVMe state]
  }
  return absl::OkStatus();
}

absl::StatusOr<offload::NvmeExtent> NvmeState::WriteTarget(const offload::NvmeExtent& live, size_t lane) {
  // Nobody else holds it: in place. The common case (no save in flight), checked before the let-go signal's
  // mutex; the loop checks again after reading the signal, so a let-go between the two is not missed.
  if (!live.shared()) return offload::NvmeExtent();
  const memory::Kind kind = lane == 0 ? memory::Kind::kMaster : memory::Kind::kOptimizerState;
  for (;;) {
    const uint64_t seen = let_go_->Seen();
    if (!live.shared()) return offload::NvmeExtent();  // nobody else holds it: in place
    absl::StatusOr<offload::NvmeExtent> fresh = store_->Allocate(live.bytes(), kind);
    if (fresh.ok()) {
      ++redirects_.redirected_tiles;
      return fresh;
    }
    if (!absl::IsResourceExhausted(fresh.status())) return fresh.status();
    ++redirects_.waits;
    // A snapshot let go of a tile: room, or this one unshared.
    let_go_->WaitPast(seen,
                      "the NVMe optimizer state has no room to write a tile apart from the checkpoint being written; "
                      "waiting for the checkpoint's writer to let go of a tile");
  }
}

std::unique_ptr<KindSnapshot> NvmeState::Snapshot(int unit, StateKind kind) {
  std::vector<offload::NvmeExtent> tiles;
  for (const offload::NvmeExtent& e : lanes_[unit][StateIndex(kind)]) tiles.push_back(e.Share());
  return std::make_unique<NvmeKindSnapshot>(store_.get(), let_go_, tile_elems_, elems_[unit], std::move(tiles));
}

absl::StatusOr<offload::TilePipelineStats> NvmeState::Update(int unit, const OptimizerConfig& cfg,
                                                             const TiledUpdate& up) {
  std::vector<offload::TileLane> tiles(lanes_[unit].size());  // in StateIndex order
  // Note [Snapshots of NVMe state]: the tiles a snapshot holds are written to fresh extents.
  std::vector<std::vector<offload::NvmeExtent>> fresh(tiles.size());
  for (size_t l = 0; l < tiles.size(); ++l) {
    for (const offload::NvmeExtent& e : lanes_[unit][l]) {
      tiles[l].tiles.push_back(&e);
      STRATA_ASSIGN_OR_RETURN(offload::NvmeExtent target, WriteTarget(e, l));
      fresh[l].push_back(std::move(target));
    }
    for (const offload::NvmeExtent& e : fresh[l]) tiles[l].write_to.push_back(e.empty() ? nullptr : &e);
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
  STRATA_ASSIGN_OR_RETURN(offload::TilePipelineStats stats, pipeline->Finish());
  // Only once every tile is written: after a failure the redirected tiles keep their old values.
  for (size_t l = 0; l < fresh.size(); ++l) {
    for (size_t t = 0; t < fresh[l].size(); ++t) {
      if (!fresh[l][t].empty()) lanes_[unit][l][t] = std::move(fresh[l][t]);
    }
  }
  return stats;
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
