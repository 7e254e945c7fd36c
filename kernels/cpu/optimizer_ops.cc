// Segment tiling for the fused optimizer passes (see optimizer_ops.h). Baseline-ISA file: the float
// coefficients are computed here (AdamWCoeffsOf), never in a vector translation unit.
#include "kernels/cpu/optimizer_ops.h"

namespace strata::kernels::cpu {
namespace {

// Where a participant is in the segment list: segment `seg` starts at position `base` of the
// concatenated (end-to-end) index space. Tasks arrive in increasing order per participant, so it only
// moves forward.
struct Cursor {
  size_t seg = 0;
  size_t base = 0;
};

template <class Seg>
size_t TotalElems(const Seg* segs, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += segs[i].end - segs[i].begin;
  return total;
}

// Calls piece(seg, begin, end) for the parts of segments covering concatenated positions [lo, hi).
template <class Seg, class Piece>
void ForEachPiece(const Seg* segs, size_t count, Cursor& c, size_t lo, size_t hi, Piece& piece) {
  while (c.seg < count && c.base + (segs[c.seg].end - segs[c.seg].begin) <= lo) {
    c.base += segs[c.seg].end - segs[c.seg].begin;
    ++c.seg;
  }
  Cursor w = c;
  for (size_t pos = lo; pos < hi && w.seg < count;) {
    const Seg& s = segs[w.seg];
    const size_t len = s.end - s.begin, off = pos - w.base;
    const size_t take = (len - off < hi - pos) ? len - off : hi - pos;
    if (take > 0) piece(s, s.begin + off, s.begin + off + take);
    pos += take;
    if (off + take == len) {
      w.base += len;
      ++w.seg;
    }
  }
}

// Runs piece over every segment: directly on the caller without a pool, else tile by tile.
template <class Seg, class Piece>
void RunSegments(ThreadPool* pool, const Seg* segs, size_t count, Piece& piece) {
  const size_t total = TotalElems(segs, count);
  const size_t tiles = (total + kOptimizerTileElems - 1) / kOptimizerTileElems;
  if (pool == nullptr || pool->threads() == 1 || tiles <= 1) {
    for (size_t i = 0; i < count; ++i) {
      if (segs[i].end > segs[i].begin) piece(segs[i], segs[i].begin, segs[i].end);
    }
    return;
  }
  Cursor cursors[ThreadPool::kMaxThreads];
  auto task = [&](size_t t, int participant) {
    const size_t lo = t * kOptimizerTileElems;
    const size_t hi = lo + kOptimizerTileElems < total ? lo + kOptimizerTileElems : total;
    ForEachPiece(segs, count, cursors[participant], lo, hi, piece);
  };
  pool->ParallelFor(tiles, task);
}

}  // namespace

void AdamWSegments(const CpuKernels& k, ThreadPool* pool, const OptimizerArrays& a, const AdamWSegment* segs,
                   size_t count, float grad_scale) {
  auto piece = [&](const AdamWSegment& s, size_t begin, size_t end) {
    k.adamw(a, begin, end, AdamWCoeffsOf(*s.step), grad_scale);
  };
  RunSegments(pool, segs, count, piece);
}

void SgdSegments(const CpuKernels& k, ThreadPool* pool, const OptimizerArrays& a, const SgdSegment* segs,
                 size_t count, float grad_scale) {
  auto piece = [&](const SgdSegment& s, size_t begin, size_t end) { k.sgd(a, begin, end, *s.step, grad_scale); };
  RunSegments(pool, segs, count, piece);
}

}  // namespace strata::kernels::cpu
