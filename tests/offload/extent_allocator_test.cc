// Tests for offload/extent_allocator: best fit, coalescing, alignment, errors, and a random
// allocate/free sequence checked against an interval oracle (no overlap, accounting exact).
#include "runtime/offload/extent_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

namespace strata::offload {
namespace {

using ::testing::HasSubstr;

TEST(ExtentAllocator, RoundsToTheAlignmentAndCarvesFromTheStart) {
  ExtentAllocator a(1 << 20, 4096);
  EXPECT_EQ(*a.Allocate(1), 0u);
  EXPECT_EQ(*a.Allocate(4097), 4096u);
  EXPECT_EQ(*a.Allocate(4096), 3 * 4096u);
  EXPECT_EQ(a.used_bytes(), 4 * 4096u);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExtentAllocator, PicksTheSmallestHoleThatFits) {
  ExtentAllocator a(100 * 4096, 4096);
  std::vector<uint64_t> off;
  for (uint64_t pages : {5, 1, 3, 1, 2, 1}) off.push_back(*a.Allocate(pages * 4096));
  a.Free(off[0], 5 * 4096);  // hole of 5 at 0
  a.Free(off[2], 3 * 4096);  // hole of 3
  a.Free(off[4], 2 * 4096);  // hole of 2
  EXPECT_EQ(*a.Allocate(2 * 4096), off[4]) << "exact fit";
  EXPECT_EQ(*a.Allocate(3 * 4096), off[2]);
  EXPECT_EQ(*a.Allocate(4096), off[0]) << "smallest remaining hole (5 pages) at the lowest offset";
}

TEST(ExtentAllocator, CoalescesNeighboursOnFree) {
  ExtentAllocator a(4 * 4096, 4096);
  const uint64_t x = *a.Allocate(4096), y = *a.Allocate(4096), z = *a.Allocate(4096), w = *a.Allocate(4096);
  EXPECT_EQ(a.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  a.Free(y, 4096);
  a.Free(w, 4096);
  EXPECT_EQ(a.free_ranges(), 2u);
  a.Free(z, 4096);  // joins y and w
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 3 * 4096u);
  a.Free(x, 4096);
  EXPECT_EQ(a.largest_free_bytes(), 4 * 4096u);
  EXPECT_EQ(a.used_bytes(), 0u);
}

// Grow (NvmeStore::Grow): the new bytes join a free range that ends at the old capacity, else start one; a smaller
// capacity changes nothing; freeing a range past the old capacity is accepted.
TEST(ExtentAllocator, GrowJoinsTheFreeTailAndTakesFrees) {
  ExtentAllocator a(3 * 4096, 4096);
  const uint64_t x = *a.Allocate(2 * 4096);
  a.Grow(5 * 4096 + 100);  // rounded down
  EXPECT_EQ(a.capacity_bytes(), 5 * 4096u);
  EXPECT_EQ(a.free_ranges(), 1u) << "the old tail and the new bytes are one range";
  EXPECT_EQ(a.largest_free_bytes(), 3 * 4096u);
  const uint64_t y = *a.Allocate(3 * 4096);
  EXPECT_EQ(y, 2 * 4096u);
  a.Grow(4 * 4096);
  EXPECT_EQ(a.capacity_bytes(), 5 * 4096u);
  a.Grow(6 * 4096);  // the tail is taken: a range of its own
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(*a.Allocate(4096), 5 * 4096u);
  a.Free(y, 3 * 4096);
  a.Free(x, 2 * 4096);
  EXPECT_EQ(a.used_bytes(), 4096u);
  EXPECT_EQ(a.largest_free_bytes(), 5 * 4096u);
}

TEST(ExtentAllocator, FullErrorNamesAskedFreeAndLargestRange) {
  ExtentAllocator a(3 * 4096, 4096);
  const uint64_t x = *a.Allocate(4096);
  (void)*a.Allocate(4096);
  a.Free(x, 4096);
  auto s = a.Allocate(2 * 4096);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("asked 8.00 KiB"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("8.00 KiB free"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("largest free range 4.00 KiB"));
}

TEST(ExtentAllocator, RandomSequenceNeverOverlapsAndAccountsExactly) {
  constexpr uint64_t kCap = 4096 * 1000;
  ExtentAllocator a(kCap, 4096);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded length
  std::mt19937_64 rng(42);
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t bytes = 1 + rng() % (4096 * 20);
      auto off = a.Allocate(bytes);
      if (!off.ok()) continue;
      const uint64_t len = (bytes + 4095) / 4096 * 4096;
      auto next = live.lower_bound(*off);
      ASSERT_TRUE(next == live.end() || next->first >= *off + len) << "overlap at step " << step;
      ASSERT_TRUE(next == live.begin() || std::prev(next)->first + std::prev(next)->second <= *off);
      ASSERT_LE(*off + len, kCap);
      live[*off] = len;
      used += len;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first, it->second);
      used -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(a.used_bytes(), used) << "step " << step;
  }
  for (auto& [off, len] : live) a.Free(off, len);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), kCap);
}

}  // namespace
}  // namespace strata::offload
