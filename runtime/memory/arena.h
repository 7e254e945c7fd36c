// A first-fit arena over one pre-reserved block (docs/design.md "Memory is a contract": the CUDA device tier
// takes its memory as one cudaMalloc per budget and sub-allocates here, never the caching allocator).
// Blocks are aligned; freed neighbours coalesce. The bookkeeping lives on the host and is independent
// of where the block is, so it is tested on host memory and serves device memory unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/status/statusor.h"

namespace strata::memory {

class Arena {
 public:
  // Manages [base, base + bytes). `base` may be a device pointer: the arena never dereferences it.
  Arena(void* base, size_t bytes, size_t alignment = 256);
  // ResourceExhausted naming the bytes asked, free and the largest free block (fragmentation).
  absl::StatusOr<void*> Allocate(size_t bytes);
  // InvalidArgument for a pointer the arena did not hand out (or already freed).
  absl::Status Free(void* p);
  size_t used_bytes() const { return used_; }
  size_t capacity_bytes() const { return capacity_; }
  size_t largest_free_block() const;

 private:
  uintptr_t base_;
  size_t capacity_;
  size_t alignment_;
  size_t used_ = 0;
  std::map<uintptr_t, size_t> free_;  // offset -> size, coalesced
  std::map<uintptr_t, size_t> live_;  // offset -> size
};

}  // namespace strata::memory
