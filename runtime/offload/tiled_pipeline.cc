#include "runtime/offload/tiled_pipeline.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/device.h"

namespace strata::offload {
namespace {

constexpr size_t kSlots = 3;

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

// The pipeline's state: buffers per slot and lane, and the I/O in flight per slot.
class Pipeline {
 public:
  Pipeline(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes) : store_(store), lanes_(lanes) {
    for (auto& slot : buffers_) {
      for (size_t l = 0; l < lanes.size(); ++l) slot.push_back(pool.Acquire());
    }
  }

  absl::Status Run(const TileFn& fn) {
    const size_t n = lanes_[0].tiles.size();
    stats_.tiles = n;
    if (n > 0) IssueReads(0);
    for (size_t i = 0; i < n; ++i) {
      const size_t slot = i % kSlots;
      if (i + 1 < n) {
        const size_t reuse = (i + 1) % kSlots;  // last used by the write of tile i - 2
        STRATA_RETURN_IF_ERROR(Annotate(Timed(&stats_.write_wait_ns, [&] { return WaitAll(writes_[reuse]); }),
                                        Tile(write_tile_[reuse], "writing")));
        IssueReads(i + 1);
      }
      STRATA_RETURN_IF_ERROR(
          Annotate(Timed(&stats_.read_wait_ns, [&] { return WaitAll(reads_[slot]); }), Tile(i, "reading")));
      std::vector<memory::BufferView> views;
      for (size_t l = 0; l < lanes_.size(); ++l) {
        views.push_back(buffers_[slot][l].view().Slice(0, lanes_[l].tiles[i]->bytes()));
      }
      STRATA_RETURN_IF_ERROR(Annotate(Timed(&stats_.compute_ns, [&] { return fn(i, views); }), Tile(i, "computing")));
      IssueWrites(i);
    }
    return DrainWrites();
  }

  // Waits for everything still in flight (after an error, too).
  absl::Status DrainWrites() {
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

  const TilePipelineStats& stats() const { return stats_; }

 private:
  static std::string Tile(size_t i, const char* what) { return absl::StrCat("tiled pipeline, ", what, " tile ", i); }

  // Runs f() and adds its duration to *ns.
  template <typename F>
  static absl::Status Timed(int64_t* ns, F&& f) {
    const int64_t t0 = device::NowNs();
    absl::Status s = f();
    *ns += device::NowNs() - t0;
    return s;
  }

  void IssueReads(size_t i) {
    auto& works = reads_[i % kSlots];
    works.clear();
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (!lanes_[l].read) continue;
      works.push_back(store_.Read(*lanes_[l].tiles[i], buffers_[i % kSlots][l].view()));
      stats_.bytes_read += lanes_[l].tiles[i]->bytes();
    }
  }

  void IssueWrites(size_t i) {
    auto& works = writes_[i % kSlots];
    works.clear();
    write_tile_[i % kSlots] = i;
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (!lanes_[l].write_back) continue;
      works.push_back(store_.Write(*lanes_[l].tiles[i], buffers_[i % kSlots][l].view()));
      stats_.bytes_written += lanes_[l].tiles[i]->bytes();
    }
  }

  NvmeStore& store_;
  absl::Span<const TileLane> lanes_;
  std::array<std::vector<PinnedBuffer>, kSlots> buffers_;
  std::array<std::vector<IoWork>, kSlots> reads_, writes_;
  std::array<size_t, kSlots> write_tile_{};
  TilePipelineStats stats_;
};

}  // namespace

absl::StatusOr<TilePipelineStats> RunTiledPipeline(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes,
                                                   const TileFn& fn) {
  STRATA_RETURN_IF_ERROR(CheckLanes(pool, lanes));
  Pipeline p(store, pool, lanes);
  absl::Status s = p.Run(fn);
  absl::Status drained = p.DrainWrites();  // no-op after success; after a failure, nothing may stay in flight
  if (!s.ok()) return s;
  STRATA_RETURN_IF_ERROR(drained);
  return p.stats();
}

}  // namespace strata::offload
