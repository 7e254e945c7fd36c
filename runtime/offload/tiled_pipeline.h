// RunTiledPipeline: steps NVMe-resident state tile by tile through pinned buffers, overlapping the
// I/O of the neighbours with the work on the current tile (docs/design.md "Optimizer": read tile i+1 and write
// tile i-1 while tile i updates).
//
// Protocol. The state is described as lanes (one per array: fp32 master, Adam m, Adam v, ...); lane l
// holds one NvmeExtent per tile, tile i of every lane covering the same elements. For each tile, in
// order: every lane with `read` is read into a pinned buffer, `fn(i, views)` runs on the calling thread
// with one view per lane (view.bytes == that tile's extent bytes), then every lane with `write_back` is
// written from that buffer. Three buffers per lane rotate (slot = i % 3): while fn(i) runs, the reads of
// tile i+1 and the writes of tile i-1 are in flight; before reusing a slot for tile i+1 the pipeline
// waits for the write of tile i-2 that last used it.
//
// Requirements. Every lane has the same number of tiles; every tile extent fits in pool.buffer_bytes();
// the pool has at least 3 x lanes buffers (they are acquired, blocking, at the start and returned at the
// end). Extents must have been written before a lane reads them (or the lane sets read = false).
//
// Failure. The first error (I/O, checksum, or fn) stops new work; everything already in flight is
// waited for before returning, so no buffer is in use afterwards. The error names the tile. Tiles after
// the failed one are untouched; earlier ones are written (except a failed write itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
};

// Where the time went, for the engine's "exposed I/O" metric.
struct TilePipelineStats {
  size_t tiles = 0;
  int64_t compute_ns = 0;     // inside fn
  int64_t read_wait_ns = 0;   // blocked on reads: exposed read time
  int64_t write_wait_ns = 0;  // blocked on writes (slot reuse and the final drain): exposed write time
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

using TileFn = std::function<absl::Status(size_t tile, absl::Span<const memory::BufferView> lanes)>;

absl::StatusOr<TilePipelineStats> RunTiledPipeline(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes,
                                                   const TileFn& fn);

}  // namespace strata::offload
