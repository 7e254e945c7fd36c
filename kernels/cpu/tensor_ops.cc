// Tiling of the element-wise kernels and the fixed-order reductions (see tensor_ops.h).
#include "kernels/cpu/tensor_ops.h"

namespace strata::kernels::cpu {
namespace {

size_t Tiles(size_t n, size_t tile) { return (n + tile - 1) / tile; }

// Runs body(begin, end) over [0, n) in tiles of kElementwiseTileElems.
template <class Body>
void ForTiles(ThreadPool* pool, size_t n, Body& body) {
  const size_t tiles = Tiles(n, kElementwiseTileElems);
  if (pool == nullptr || pool->threads() == 1 || tiles <= 1) {
    if (n > 0) body(size_t{0}, n);
    return;
  }
  auto task = [&](size_t t, int) {
    const size_t lo = t * kElementwiseTileElems;
    body(lo, lo + kElementwiseTileElems < n ? lo + kElementwiseTileElems : n);
  };
  pool->ParallelFor(tiles, task);
}

constexpr size_t kChunkElems = kSumTileElems * kSumChunkTiles;
constexpr size_t kChunksPerBatch = 512;  // partial sums kept on the stack per pool round (4 KiB)

// The chunk's tiles summed in order (tensor_ops.h).
double ChunkSum(const CpuKernels& k, const float* x, size_t n) {
  double sum = 0.0;
  for (size_t lo = 0; lo < n; lo += kSumTileElems) {
    sum += k.sum_squares(x + lo, n - lo < kSumTileElems ? n - lo : kSumTileElems);
  }
  return sum;
}

}  // namespace

void CastToBf16(const CpuKernels& k, ThreadPool* pool, const float* x, uint16_t* y, size_t n) {
  auto body = [&](size_t b, size_t e) { k.cast_bf16(x + b, y + b, e - b); };
  ForTiles(pool, n, body);
}

void CastToHalf(const CpuKernels& k, ThreadPool* pool, const float* x, uint16_t* y, size_t n) {
  auto body = [&](size_t b, size_t e) { k.cast_f16(x + b, y + b, e - b); };
  ForTiles(pool, n, body);
}

void Scale(const CpuKernels& k, ThreadPool* pool, const float* x, float* y, size_t n, float s) {
  auto body = [&](size_t b, size_t e) { k.scale(x + b, y + b, e - b, s); };
  ForTiles(pool, n, body);
}

void Accumulate(const CpuKernels& k, ThreadPool* pool, const float* x, float* y, size_t n) {
  auto body = [&](size_t b, size_t e) { k.accumulate(x + b, y + b, e - b); };
  ForTiles(pool, n, body);
}

void AccumulateBf16(const uint16_t* x, uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToBf16(Bf16ToFloat(y[i]) + Bf16ToFloat(x[i]));
}

void AccumulateHalf(const uint16_t* x, uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToHalf(HalfToFloat(y[i]) + HalfToFloat(x[i]));
}

void ScaleBf16(uint16_t* y, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToBf16(Bf16ToFloat(y[i]) * s);
}

void ScaleHalf(uint16_t* y, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) y[i] = FloatToHalf(HalfToFloat(y[i]) * s);
}

double SumSquaresInOrder(const float* x, size_t n) {
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

double SumSquares(const CpuKernels& k, ThreadPool* pool, const float* x, size_t n) {
  const size_t chunks = Tiles(n, kChunkElems);
  double total = 0.0;
  double partial[kChunksPerBatch];
  for (size_t first = 0; first < chunks; first += kChunksPerBatch) {
    const size_t batch = chunks - first < kChunksPerBatch ? chunks - first : kChunksPerBatch;
    auto task = [&](size_t c, int) {
      const size_t lo = (first + c) * kChunkElems;
      partial[c] = ChunkSum(k, x + lo, n - lo < kChunkElems ? n - lo : kChunkElems);
    };
    if (pool != nullptr) {
      pool->ParallelFor(batch, task);
    } else {
      for (size_t c = 0; c < batch; ++c) task(c, 0);
    }
    for (size_t c = 0; c < batch; ++c) total += partial[c];
  }
  return total;
}

size_t CountNonFinite(const CpuKernels& k, ThreadPool* pool, const float* x, size_t n) {
  const size_t tiles = Tiles(n, kElementwiseTileElems);
  if (pool == nullptr || pool->threads() == 1 || tiles <= 1) return k.count_non_finite(x, n);
  std::atomic<size_t> count{0};
  auto task = [&](size_t t, int) {
    const size_t lo = t * kElementwiseTileElems;
    const size_t c = k.count_non_finite(x + lo, n - lo < kElementwiseTileElems ? n - lo : kElementwiseTileElems);
    if (c != 0) count.fetch_add(c, std::memory_order_relaxed);
  };
  pool->ParallelFor(tiles, task);
  return count.load(std::memory_order_relaxed);
}

}  // namespace strata::kernels::cpu
