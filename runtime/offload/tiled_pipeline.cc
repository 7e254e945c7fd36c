#include "runtime/offload/tiled_pipeline.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/device.h"

namespace strata::offload {
namespace {

constexpr size_t kSlots = 3;  // TiledPipeline::kSlots

absl::Status CheckLanes(const PinnedPool& pool, absl::Span<const TileLane> lanes) {
  if (lanes.empty()) return absl::InvalidArgumentError("tiled pipeline without lanes");
  if (pool.buffer_count() < kSlots * lanes.size()) {
    return absl::FailedPreconditionError(absl::StrCat("tiled pipeline over ", lanes.size(), " lanes needs ",
                                                      kSlots * lanes.size(), " pinned buffers; the pool has ",
                                                      pool.buffer_count()));
  }
  for (size_t l = 0; l < lanes.size(); ++l) {
    if (lanes[l].tiles.size() != lanes[0].tiles.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("lane ", l, " has ", lanes[l].tiles.size(), " tiles, lane 0 has ", lanes[0].tiles.size()));
    }
    for (size_t i = 0; i < lanes[l].tiles.size(); ++i) {
      const NvmeExtent* e = lanes[l].tiles[i];
      if (e == nullptr || e->empty() || e->bytes() > pool.buffer_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat("lane ", l, " tile ", i, ": extent of ", e ? e->bytes() : 0,
                                                       " bytes missing or larger than the pinned buffers (",
                                                       pool.buffer_bytes(), " bytes)"));
      }
    }
  }
  return absl::OkStatus();
}

std::string Tile(size_t i, const char* what) { return absl::StrCat("tiled pipeline, ", what, " tile ", i); }

// Runs f() and adds its duration to *ns.
template <typename F>
absl::Status Timed(int64_t* ns, F&& f) {
  const int64_t t0 = device::NowNs();
  absl::Status s = f();
  *ns += device::NowNs() - t0;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TiledPipeline>> TiledPipeline::Start(NvmeStore& store, PinnedPool& pool,
                                                                    absl::Span<const TileLane> lanes) {
  STRATA_RETURN_IF_ERROR(CheckLanes(pool, lanes));
  std::unique_ptr<TiledPipeline> p(new TiledPipeline(store, pool, lanes));
  p->stats_.tiles = lanes[0].tiles.size();
  if (p->stats_.tiles > 0) p->IssueReads(0);
  return p;
}

TiledPipeline::TiledPipeline(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes)
    : store_(store), lanes_(lanes) {
  for (auto& slot : buffers_) {
    for (size_t l = 0; l < lanes.size(); ++l) slot.push_back(pool.Acquire());
  }
}

TiledPipeline::~TiledPipeline() { DrainWrites().IgnoreError(); }  // no-op after Finish()

bool TiledPipeline::Next() {
  const size_t n = stats_.tiles, i = next_;
  if (!error_.ok() || i >= n) return false;
  const size_t slot = i % kSlots;
  if (i + 1 < n) {
    const size_t reuse = (i + 1) % kSlots;  // last used by the write of tile i - 2
    error_ = Annotate(Timed(&stats_.write_wait_ns, [&] { return WaitAll(writes_[reuse]); }),
                      Tile(write_tile_[reuse], "writing"));
    if (!error_.ok()) return false;
    IssueReads(i + 1);
  }
  error_ = Annotate(Timed(&stats_.read_wait_ns, [&] { return WaitAll(reads_[slot]); }), Tile(i, "reading"));
  if (!error_.ok()) return false;
  views_.clear();
  for (size_t l = 0; l < lanes_.size(); ++l) {
    views_.push_back(buffers_[slot][l].view().Slice(0, lanes_[l].tiles[i]->bytes()));
  }
  ++next_;
  compute_start_ns_ = device::NowNs();
  return true;
}

void TiledPipeline::Done(const absl::Status& work) {
  stats_.compute_ns += device::NowNs() - compute_start_ns_;
  if (!error_.ok()) return;
  error_ = Annotate(work, Tile(tile(), "computing"));
  if (error_.ok()) IssueWrites(tile());
}

absl::StatusOr<TilePipelineStats> TiledPipeline::Finish() {
  absl::Status drained = DrainWrites();  // after a failure, too: nothing may stay in flight
  if (!error_.ok()) return error_;
  STRATA_RETURN_IF_ERROR(drained);
  if (next_ < stats_.tiles) {
    return absl::FailedPreconditionError(
        absl::StrCat("tiled pipeline finished after ", next_, " of ", stats_.tiles, " tiles"));
  }
  return stats_;
}

// Waits for everything still in flight (after an error, too).
absl::Status TiledPipeline::DrainWrites() {
  absl::Status first;
  for (size_t s = 0; s < kSlots; ++s) {
    absl::Status r = WaitAll(reads_[s]);
    absl::Status w = Timed(&stats_.write_wait_ns, [&] { return WaitAll(writes_[s]); });
    if (first.ok()) first = !w.ok() ? Annotate(w, Tile(write_tile_[s], "writing")) : r;
    reads_[s].clear();
    writes_[s].clear();
  }
  return first;
}

void TiledPipeline::IssueReads(size_t i) {
  auto& works = reads_[i % kSlots];
  works.clear();
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (!lanes_[l].read) continue;
    works.push_back(store_.Read(*lanes_[l].tiles[i], buffers_[i % kSlots][l].view()));
    stats_.bytes_read += lanes_[l].tiles[i]->bytes();
  }
}

void TiledPipeline::IssueWrites(size_t i) {
  auto& works = writes_[i % kSlots];
  works.clear();
  write_tile_[i % kSlots] = i;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (!lanes_[l].write_back) continue;
    const std::vector<const NvmeExtent*>& to = lanes_[l].write_to;
    const NvmeExtent* target = i < to.size() && to[i] != nullptr ? to[i] : lanes_[l].tiles[i];
    works.push_back(store_.Write(*target, buffers_[i % kSlots][l].view()));
    stats_.bytes_written += lanes_[l].tiles[i]->bytes();
  }
}

}  // namespace strata::offload
