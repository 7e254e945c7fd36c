#include "runtime/offload/extent_allocator.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"

namespace strata::offload {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment)
    : alignment_(alignment), capacity_(capacity_bytes & ~(alignment - 1)) {
  STRATA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  if (capacity_ > 0) InsertFree(0, capacity_);
}

absl::StatusOr<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("an NVMe extent needs at least one byte");
  const uint64_t need = Round(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto fit = by_size_.lower_bound({need, 0});
  if (need < bytes || fit == by_size_.end()) {
    const uint64_t largest = by_size_.empty() ? 0 : by_size_.rbegin()->first;
    return absl::ResourceExhaustedError(absl::StrCat(
        "NVMe store is full: asked ", FormatBytes(need), " (", need, " bytes), ", FormatBytes(capacity_ - used_),
        " free of ", FormatBytes(capacity_), ", largest free range ", FormatBytes(largest)));
  }
  const auto [length, offset] = *fit;
  EraseFree(by_offset_.find(offset));
  if (length > need) InsertFree(offset + need, length - need);
  used_ += need;
  return offset;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  const uint64_t length = Round(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK_MSG(offset % alignment_ == 0 && offset + length <= capacity_ && length <= used_,
                   absl::StrCat("freeing extent [", offset, ", +", length, ") that was not allocated"));
  uint64_t start = offset, end = offset + length;
  auto next = by_offset_.lower_bound(offset);
  STRATA_CHECK_MSG(next == by_offset_.end() || next->first >= end, "double free of an NVMe extent");
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    STRATA_CHECK_MSG(prev->first + prev->second <= start, "double free of an NVMe extent");
    if (prev->first + prev->second == start) {
      start = prev->first;
      EraseFree(prev);
    }
  }
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    EraseFree(next);
  }
  InsertFree(start, end - start);
  used_ -= length;
}

void ExtentAllocator::Grow(uint64_t new_capacity) {
  new_capacity &= ~(alignment_ - 1);
  std::lock_guard<std::mutex> lock(mu_);
  if (new_capacity <= capacity_) return;
  uint64_t start = capacity_;
  if (!by_offset_.empty()) {
    auto last = std::prev(by_offset_.end());
    if (last->first + last->second == capacity_) {
      start = last->first;
      EraseFree(last);
    }
  }
  InsertFree(start, new_capacity - start);
  capacity_ = new_capacity;
}

uint64_t ExtentAllocator::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void ExtentAllocator::InsertFree(uint64_t offset, uint64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
}

void ExtentAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

uint64_t ExtentAllocator::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

size_t ExtentAllocator::free_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_offset_.size();
}

}  // namespace strata::offload
