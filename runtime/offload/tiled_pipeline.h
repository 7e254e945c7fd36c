// TiledPipeline: steps NVMe-resident state tile by tile through pinned buffers, overlapping the
// I/O of the neighbours with the work on the current tile (docs/design.md "Optimizer": read tile i+1 and write
// tile i-1 while tile i updates).
//
// Protocol. The state is described as lanes (one per array: fp32 master, Adam m, Adam v, ...); lane l
// holds one NvmeExtent per tile, tile i of every lane covering the same elements. The caller drives the
// pipeline, so that offload/ never calls back into the layer above (docs/design.md "Calls only descend"):
//
//   STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TiledPipeline> p, TiledPipeline::Start(store, pool, lanes));
//   while (p->Next()) p->Done(Work(p->tile(), p->views()));
//   return p->Finish();
//
// For each tile, in order: every lane with `read` is read into a pinned buffer; Next() returns with
// views() holding one view per lane (view.bytes == that tile's extent bytes); the caller works on them on
// its own thread and hands Done() the work's status; then every lane with `write_back` is written from that
// buffer (to the lane's write_to[i] where it has one). Three buffers per lane rotate (slot = i % 3): while
// the caller works on tile i, the reads of tile i+1 and the writes of tile i-1 are in flight; before reusing
// a slot for tile i+1 the pipeline waits for the write of tile i-2 that last used it.
//
// Requirements. Every lane has the same number of tiles; every tile extent fits in pool.buffer_bytes();
// the pool has at least 3 x lanes buffers (they are acquired, blocking, at the start and returned at the
// end). Extents must have been written before a lane reads them (or the lane sets read = false).
//
// Failure. The first error (I/O, checksum, or the work Done() is handed) stops new work: Next() returns
// false, and Finish() waits for everything already in flight before it returns that error, so no buffer is
// in use afterwards (the destructor drains too). The error names the tile. Tiles after the failed one are
// untouched; earlier ones are written (except a failed write itself).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"

namespace strata::offload {

struct TileLane {
  std::vector<const NvmeExtent*> tiles;  // tile i of this array; not owned
  bool read = true;                      // false: fn fills the tile (e.g. zero-initialised state)
  bool write_back = true;                // false: read-only input (e.g. gradients staged on NVMe)
  // Where tile i is written back when write_to[i] is set (else tiles[i], in place): a fresh extent that
  // replaces a tile a snapshot still holds (Note [Snapshots of NVMe state] in optim/nvme_state.h).
  std::vector<const NvmeExtent*> write_to;
};

// Where the time went, for the engine's "exposed I/O" metric.
struct TilePipelineStats {
  size_t tiles = 0;
  int64_t compute_ns = 0;     // the caller's work, from Next() to Done()
  int64_t read_wait_ns = 0;   // blocked on reads: exposed read time
  int64_t write_wait_ns = 0;  // blocked on writes (slot reuse and the final drain): exposed write time
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

class TiledPipeline {
 public:
  // Checks the lanes against the pool (Requirements above), acquires the buffers and issues tile 0's reads.
  static absl::StatusOr<std::unique_ptr<TiledPipeline>> Start(NvmeStore& store, PinnedPool& pool,
                                                              absl::Span<const TileLane> lanes);
  ~TiledPipeline();  // waits for what is still in flight, then returns the buffers
  TiledPipeline(const TiledPipeline&) = delete;
  TiledPipeline& operator=(const TiledPipeline&) = delete;

  // The next tile is read and views() holds it (issuing the reads of the one after); false after the last
  // tile or once an error stopped the pipeline.
  bool Next();
  size_t tile() const { return next_ - 1; }  // the tile Next() made ready
  absl::Span<const memory::BufferView> views() const { return views_; }
  // The caller's work on tile(): ok issues the tile's writes; an error stops the pipeline.
  void Done(const absl::Status& work);
  // Waits for everything in flight; the first error, else where the time went.
  absl::StatusOr<TilePipelineStats> Finish();

 private:
  static constexpr size_t kSlots = 3;
  TiledPipeline(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes);
  void IssueReads(size_t i);
  void IssueWrites(size_t i);
  absl::Status DrainWrites();

  NvmeStore& store_;
  absl::Span<const TileLane> lanes_;
  std::array<std::vector<PinnedBuffer>, kSlots> buffers_;
  std::array<std::vector<IoWork>, kSlots> reads_, writes_;
  std::array<size_t, kSlots> write_tile_{};
  std::vector<memory::BufferView> views_;
  size_t next_ = 0;               // tiles made ready so far
  int64_t compute_start_ns_ = 0;  // when Next() handed out the current tile
  absl::Status error_;            // the first error; it stops the pipeline
  TilePipelineStats stats_;
};

}  // namespace strata::offload
