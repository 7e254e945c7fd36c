// ExtentAllocator: best-fit allocation of aligned byte ranges in a fixed address space (the logical
// space of an NvmeStore).
//
// Why best-fit and not fixed-size slots: the store holds shards of many sizes (a unit's parameter
// shard, its fp32 master, Adam m and v, optimizer tiles), fixed slots would waste the difference. Best fit
// (smallest free range that fits, lowest offset among equals; carve from its start) with coalescing of
// neighbours on free keeps fragmentation low for the engine's pattern: allocate everything at setup,
// free at teardown. Both operations are O(log ranges). Every size is rounded up to `alignment`, so every
// extent starts and ends on an O_DIRECT boundary.
//
// Failure: a request that does not fit is ResourceExhausted naming the bytes asked, the bytes free and
// the largest free range (so fragmentation is visible). Freeing a range that is not allocated is a
// broken internal invariant (STRATA_CHECK). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/status/statusor.h"

namespace strata::offload {

class ExtentAllocator {
 public:
  // `capacity_bytes` is rounded down to `alignment` (a power of two).
  ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment);

  // The offset of a fresh range of RoundUp(bytes, alignment) bytes (bytes > 0).
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // Returns a range from Allocate (same `bytes`).
  void Free(uint64_t offset, uint64_t bytes);
  // Makes [capacity_bytes(), new_capacity) free too (rounded down to alignment); a smaller capacity changes nothing.
  void Grow(uint64_t new_capacity);

  uint64_t alignment() const { return alignment_; }
  uint64_t capacity_bytes() const;
  uint64_t used_bytes() const;
  uint64_t largest_free_bytes() const;
  size_t free_ranges() const;

 private:
  uint64_t Round(uint64_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }
  void InsertFree(uint64_t offset, uint64_t length);          // mu_ held
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);  // mu_ held

  const uint64_t alignment_;
  mutable std::mutex mu_;
  uint64_t capacity_;  // guarded by mu_
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // free ranges: offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // free ranges: (length, offset)
};

}  // namespace strata::offload
