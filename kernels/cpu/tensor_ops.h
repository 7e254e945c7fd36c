// Element-wise tensor kernels and reductions over whole buffers, on a ThreadPool.
//
// Guarantees:
//  - Casts and Scale give the scalar element math's bits (element_math.h) for every ISA and thread count.
//  - SumSquares is deterministic: Note [Sum of squares order] per tile of kSumTileElems, tile results
//    summed in order within chunks of kSumChunkTiles tiles, chunk results summed in order. The result
//    depends only on the data, not on the ISA table, the pool or its thread count.
//  - pool == nullptr runs on the calling thread. Nothing allocates (reductions keep their partial sums
//    on the caller's stack), nothing reads the environment.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::kernels::cpu {

inline constexpr size_t kElementwiseTileElems = 65536;
inline constexpr size_t kSumTileElems = 16384;
inline constexpr size_t kSumChunkTiles = 16;

// y[i] = FloatToBf16(x[i]) (or FloatToHalf) for i < n.
void CastToBf16(const CpuKernels& k, ThreadPool* pool, const float* x, uint16_t* y, size_t n);
void CastToHalf(const CpuKernels& k, ThreadPool* pool, const float* x, uint16_t* y, size_t n);

// y[i] = x[i] * s; y == x allowed.
void Scale(const CpuKernels& k, ThreadPool* pool, const float* x, float* y, size_t n, float s);

// y[i] += x[i] (fp32 adds: the same bits for every ISA and thread count); x and y must not overlap.
void Accumulate(const CpuKernels& k, ThreadPool* pool, const float* x, float* y, size_t n);

// The 16-bit forms, element by element through fp32 with the element math's rounding (element_math.h):
// y[i] = round(float(y[i]) + float(x[i])), y[i] = round(float(y[i]) * s). Scalar: the collectives that use
// them (bf16 / fp16 reductions) are bound by the transfer, not by this loop.
void AccumulateBf16(const uint16_t* x, uint16_t* y, size_t n);
void AccumulateHalf(const uint16_t* x, uint16_t* y, size_t n);
void ScaleBf16(uint16_t* y, size_t n, float s);
void ScaleHalf(uint16_t* y, size_t n, float s);

// Sum of x[i]^2 in double, in the fixed order above.
double SumSquares(const CpuKernels& k, ThreadPool* pool, const float* x, size_t n);

// Sum of x[i]^2 in double, strictly in index order on the calling thread: the order of the engine's global
// gradient norm since its first release (so the clip coefficient, and every run, keep their bits). Not the
// order above; slower (one dependent add per element).
double SumSquaresInOrder(const float* x, size_t n);

// Number of Inf / NaN elements.
size_t CountNonFinite(const CpuKernels& k, ThreadPool* pool, const float* x, size_t n);

}  // namespace strata::kernels::cpu
