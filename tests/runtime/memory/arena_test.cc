#include "runtime/memory/arena.h"

#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::memory {
namespace {

// Page-aligned host storage standing in for a device block.
struct Block {
  explicit Block(size_t n) : bytes(n), data(static_cast<char*>(std::aligned_alloc(4096, n))) {}
  ~Block() { std::free(data); }
  size_t size() const { return bytes; }
  size_t bytes;
  char* data;
};

TEST(Arena, AlignsAllocatesAndReportsExhaustionWithFragmentation) {
  std::vector<char> block(4096 + 100);
  Arena a(block.data() + 3, 4096, 256);  // a misaligned base: only aligned blocks are handed out
  auto p = a.Allocate(1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
  EXPECT_EQ(a.used_bytes(), 256u);
  auto q = a.Allocate(5000);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(q.status().message()), ::testing::HasSubstr("largest free block"));
}

TEST(Arena, FreedNeighboursCoalesce) {
  Block block(1 << 16);
  Arena a(block.data, block.size(), 256);
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(*a.Allocate(1024));
  const size_t all_free = block.size() - 8 * 1024;
  EXPECT_EQ(a.largest_free_block(), all_free - all_free % 256);
  for (int i : {1, 3, 2}) ASSERT_TRUE(a.Free(ps[i]).ok());
  EXPECT_GE(a.largest_free_block(), 3 * 1024u);
  auto big = a.Allocate(3 * 1024);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(*big, ps[1]) << "the three freed neighbours form one block";
  EXPECT_EQ(a.Free(ps[1]).code(), absl::StatusCode::kOk);
  EXPECT_EQ(a.Free(ps[1]).code(), absl::StatusCode::kInvalidArgument) << "double free";
  EXPECT_EQ(a.Free(block.data + 7).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Arena, RandomWorkloadNeverOverlapsAndReturnsEverything) {
  Block block(1 << 20);
  Arena a(block.data, block.size(), 64);
  std::mt19937 rng(3);
  std::vector<std::pair<char*, size_t>> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2) {
      const size_t n = 1 + rng() % 20000;
      auto p = a.Allocate(n);
      if (!p.ok()) continue;
      for (auto& [q, m] : live) ASSERT_TRUE(static_cast<char*>(*p) + n <= q || q + m <= static_cast<char*>(*p));
      live.emplace_back(static_cast<char*>(*p), n);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i].first).ok());
      live.erase(live.begin() + i);
    }
  }
  for (auto& [p, n] : live) ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_block(), block.size());
}

}  // namespace
}  // namespace strata::memory
