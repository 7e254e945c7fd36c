// Fused optimizer steps over the parameter segments of one shard, on a ThreadPool.
//
// Guarantees:
//  - One pass over memory: each element's grad, master, m (and v) are read once and master, m (v) and
//    the optional low-precision param copy written once, in the same pass.
//  - Per-element results are those of the scalar element math (element_math.h) whatever the ISA table,
//    thread count or tiling: the update is element-wise and every table is bit-identical to the scalar one.
//  - Only elements inside segments are touched (padding between or after segments never is).
//  - Weight decay is per segment: each segment points at the step (hyper-parameters) it uses.
// Segments must not overlap. The arrays and segments are read during the call only; nothing allocates.
#pragma once

#include <cstddef>

#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::kernels::cpu {

struct AdamWSegment {
  size_t begin = 0;
  size_t end = 0;
  const AdamWStep* step = nullptr;
};

struct SgdSegment {
  size_t begin = 0;
  size_t end = 0;
  const SgdStep* step = nullptr;
};

// Work unit of the pool: the segments are laid end to end and cut into tiles of this many elements
// (about 1 MiB of AdamW traffic), so tiny segments share a tile and large ones spread over threads.
inline constexpr size_t kOptimizerTileElems = 32768;

// g = grad * grad_scale (clipping coefficient, averaging), then AdamW on every segment element.
// pool == nullptr runs on the calling thread.
void AdamWSegments(const CpuKernels& k, ThreadPool* pool, const OptimizerArrays& a, const AdamWSegment* segs,
                   size_t count, float grad_scale);

// g = grad * grad_scale, then SGD with momentum (buffer a.m) on every segment element.
void SgdSegments(const CpuKernels& k, ThreadPool* pool, const OptimizerArrays& a, const SgdSegment* segs,
                 size_t count, float grad_scale);

}  // namespace strata::kernels::cpu
