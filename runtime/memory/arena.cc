#include "runtime/memory/arena.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/units.h"

namespace strata::memory {

Arena::Arena(void* base, size_t bytes, size_t alignment)
    : base_(reinterpret_cast<uintptr_t>(base)), capacity_(bytes), alignment_(alignment) {
  // Only whole aligned blocks are handed out: start at the first aligned address.
  const uintptr_t start = RoundUp(base_, alignment_) - base_;
  if (start < bytes) free_[start] = (bytes - start) / alignment_ * alignment_;
}

absl::StatusOr<void*> Arena::Allocate(size_t bytes) {
  const size_t need = RoundUp(bytes == 0 ? 1 : bytes, alignment_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uintptr_t off = it->first;
    const size_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[off + need] = rest;
    live_[off] = need;
    used_ += need;
    return reinterpret_cast<void*>(base_ + off);
  }
  return absl::ResourceExhaustedError(absl::StrCat("arena of ", FormatBytes(capacity_), ": asked ", FormatBytes(bytes),
                                                   ", ", FormatBytes(capacity_ - used_), " free, largest free block ",
                                                   FormatBytes(largest_free_block())));
}

absl::Status Arena::Free(void* p) {
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) - base_;
  auto it = live_.find(off);
  if (p == nullptr || it == live_.end()) {
    return absl::InvalidArgumentError("Arena::Free of a pointer this arena did not hand out (or a double free)");
  }
  size_t size = it->second;
  used_ -= size;
  live_.erase(it);
  uintptr_t start = off;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + size) {  // merge with the following free block
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the preceding free block
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
  return absl::OkStatus();
}

size_t Arena::largest_free_block() const {
  size_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace strata::memory
