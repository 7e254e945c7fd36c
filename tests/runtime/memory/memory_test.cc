// Tests for runtime/memory: budgets (within, over, exact, concurrent), the ResourceExhausted message,
// Buffer ownership (move, Reset, free on destroy), the tracker's current/peak accounting per tier and
// per kind, zero-byte and aligned allocations.
#include "runtime/memory/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/units.h"

namespace strata::memory {
namespace {

using ::testing::HasSubstr;

Buffer AllocOk(Allocator& a, size_t bytes, Kind kind, size_t alignment = 64) {
  auto b = a.Allocate(bytes, kind, alignment);
  EXPECT_TRUE(b.ok()) << "allocating " << bytes << " bytes: " << b.status();
  return b.ok() ? std::move(b).value() : Buffer();
}

TEST(Allocator, AllocatesZeroFilledBytesWithinTheBudget) {
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, 4096, &tracker);
  Buffer b = AllocOk(alloc, 1000, Kind::kParamShard);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.bytes(), 1000u);
  EXPECT_EQ(b.kind(), Kind::kParamShard);
  const auto* bytes = b.as<unsigned char>();
  for (size_t i = 0; i < b.bytes(); ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i << " not zero-filled";
  EXPECT_EQ(alloc.used_bytes(), 1000u);
  EXPECT_EQ(alloc.free_bytes(), 3096u);
  EXPECT_EQ(alloc.budget_bytes(), 4096u);
  EXPECT_EQ(alloc.tier(), Tier::kDevice);
  const BufferView v = b.view();
  EXPECT_EQ(v.data, b.data());
  EXPECT_EQ(v.bytes, 1000u);
  EXPECT_EQ(v.tier, Tier::kDevice);
}

TEST(Allocator, AllocationThatExactlyFillsTheBudgetSucceeds) {
  HostAllocator alloc(Tier::kDevice, 4096, nullptr);  // a tracker is optional
  Buffer a = AllocOk(alloc, 4000, Kind::kScratch);
  Buffer b = AllocOk(alloc, 96, Kind::kScratch);
  EXPECT_EQ(alloc.free_bytes(), 0u);
}

TEST(Allocator, OverBudgetIsResourceExhaustedNamingTierAskedAndFreeAndAllocatesNothing) {
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, 1000, &tracker);
  Buffer held = AllocOk(alloc, 600, Kind::kMaster);
  auto over = alloc.Allocate(500, Kind::kOptimizerState);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  const std::string msg(over.status().message());
  EXPECT_THAT(msg, HasSubstr("device"));
  EXPECT_THAT(msg, HasSubstr("500 bytes")) << "the bytes asked";
  EXPECT_THAT(msg, HasSubstr(FormatBytes(400) + " free")) << "the bytes free";
  EXPECT_EQ(alloc.used_bytes(), 600u) << "a failed allocation must not keep its reservation";
  EXPECT_EQ(tracker.tier(Tier::kDevice).current_bytes, 600u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kOptimizerState).current_bytes, 0u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kOptimizerState).peak_bytes, 0u);
  // What does fit still fits.
  Buffer rest = AllocOk(alloc, 400, Kind::kOptimizerState);
  EXPECT_EQ(alloc.free_bytes(), 0u);
}

TEST(Allocator, OverBudgetMessageNamesEachTier) {
  for (Tier t : {Tier::kDevice, Tier::kPinnedHost, Tier::kNvme}) {
    HostAllocator alloc(t, 10, nullptr);
    auto over = alloc.Allocate(11, Kind::kScratch);
    ASSERT_FALSE(over.ok());
    EXPECT_THAT(std::string(over.status().message()), HasSubstr(absl::StrCat("'", TierName(t), "'")))
        << over.status();
  }
  EXPECT_EQ(TierName(Tier::kDevice), "device");
  EXPECT_EQ(TierName(Tier::kPinnedHost), "pinned_host");
  EXPECT_EQ(TierName(Tier::kNvme), "nvme");
}

TEST(Allocator, RequestThatWouldWrapTheCounterFails) {
  HostAllocator alloc(Tier::kPinnedHost, kUnlimited, nullptr);
  Buffer held = AllocOk(alloc, 64, Kind::kScratch);
  auto huge = alloc.Allocate(SIZE_MAX - 8, Kind::kScratch);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(alloc.used_bytes(), 64u);
}

TEST(Allocator, ZeroBytesGivesAnEmptyBufferAndUsesNothing) {
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, 0, &tracker);  // even with no budget at all
  auto b = alloc.Allocate(0, Kind::kGathered);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(b->bytes(), 0u);
  EXPECT_EQ(alloc.used_bytes(), 0u);
  EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, 0u);
}

TEST(Allocator, HonoursTheRequestedAlignment) {
  HostAllocator alloc(Tier::kDevice, kUnlimited, nullptr);
  std::vector<Buffer> held;
  for (size_t alignment : {size_t{1}, size_t{2}, size_t{8}, size_t{64}, size_t{256}, size_t{4096}, size_t{65536}}) {
    for (size_t bytes : {size_t{1}, size_t{7}, size_t{4097}}) {
      held.push_back(AllocOk(alloc, bytes, Kind::kScratch, alignment));
      const auto addr = reinterpret_cast<uintptr_t>(held.back().data());
      EXPECT_EQ(addr % alignment, 0u) << "alignment " << alignment << ", bytes " << bytes << ": address "
                                      << addr << " is off by " << addr % alignment;
    }
  }
  // The default is 64 (a cache line, and enough for every vector ISA).
  Buffer d = AllocOk(alloc, 3, Kind::kScratch);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data()) % 64, 0u);
}

TEST(Buffer, DestroyingReturnsBytesToTheBudgetAndTracker) {
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, 1024, &tracker);
  {
    Buffer b = AllocOk(alloc, 1024, Kind::kGradShard);
    EXPECT_EQ(alloc.free_bytes(), 0u);
  }
  EXPECT_EQ(alloc.used_bytes(), 0u);
  EXPECT_EQ(tracker.tier(Tier::kDevice).current_bytes, 0u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGradShard).current_bytes, 0u);
  Buffer again = AllocOk(alloc, 1024, Kind::kGradShard);  // the whole budget is available again
  EXPECT_FALSE(again.empty());
}

TEST(Buffer, MoveTransfersOwnershipExactlyOnce) {
  HostAllocator alloc(Tier::kDevice, 1024, nullptr);
  Buffer a = AllocOk(alloc, 100, Kind::kParamShard);
  void* const p = a.data();
  Buffer b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is part of the contract
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.bytes(), 100u);
  EXPECT_EQ(b.kind(), Kind::kParamShard);
  EXPECT_EQ(alloc.used_bytes(), 100u) << "a move must neither free nor double-count";
  a.Reset();  // resetting a moved-from buffer frees nothing
  EXPECT_EQ(alloc.used_bytes(), 100u);

  Buffer c = AllocOk(alloc, 200, Kind::kScratch);
  EXPECT_EQ(alloc.used_bytes(), 300u);
  c = std::move(b);  // frees c's old 200 bytes, takes b's 100
  EXPECT_EQ(alloc.used_bytes(), 100u);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.kind(), Kind::kParamShard);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  c.Reset();
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(alloc.used_bytes(), 0u);
}

// Note [Idle pages]: the whole pages inside the range go back to the OS, the partial ones at the edges are
// zeroed in place, the bytes around it are untouched, and the budget and the tracker still count it all.
TEST(Allocator, DiscardToZeroHandsThePagesBackAndLeavesZeros) {
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, kUnlimited, &tracker);
  constexpr size_t kBytes = size_t{8} << 20;
  Buffer b = AllocOk(alloc, kBytes, Kind::kGradShard);
  unsigned char* p = b.as<unsigned char>();
  std::fill(p, p + kBytes, 0xAB);
  constexpr size_t kOff = 100, kLen = (size_t{6} << 20) + 37;  // unaligned at both ends
  const Residency before = ResidentBytes(p + kOff, kLen);
  ASSERT_GT(before.whole, size_t{5} << 20);
  EXPECT_EQ(before.resident, before.whole) << "written bytes must be resident";
  ASSERT_TRUE(alloc.DiscardToZero(p + kOff, kLen));
  EXPECT_EQ(ResidentBytes(p + kOff, kLen).resident, 0u) << "the whole pages inside were not handed back";
  EXPECT_EQ(alloc.used_bytes(), kBytes);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGradShard).current_bytes, kBytes);
  for (size_t i = 0; i < kBytes; ++i) {
    const bool inside = i >= kOff && i < kOff + kLen;
    ASSERT_EQ(p[i], inside ? 0 : 0xAB) << "byte " << i << (inside ? " inside" : " outside") << " the range";
  }
  // A range without a whole page is zeroed in place.
  std::fill(p, p + 64, 0xCD);
  ASSERT_TRUE(alloc.DiscardToZero(p + 8, 40));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(p[i], i >= 8 && i < 48 ? 0 : 0xCD) << "byte " << i;
  EXPECT_TRUE(b.DiscardToZero());
  EXPECT_EQ(ResidentBytes(p, kBytes).resident, 0u);
  EXPECT_TRUE(std::all_of(p, p + kBytes, [](unsigned char c) { return c == 0; }));
}

// A tier that cannot hand pages back (device, pinned) says so and leaves the bytes alone.
TEST(Allocator, DiscardToZeroOnATierThatCannotTouchesNothing) {
  class Plain final : public Allocator {
   public:
    using Allocator::Allocator;

   protected:
    void* RawAllocate(size_t bytes, size_t alignment) override { return AlignedHostAlloc(bytes, alignment); }
    void RawFree(void* p, size_t) override { std::free(p); }
  };
  Plain alloc(Tier::kPinnedHost, kUnlimited, nullptr);
  Buffer b = AllocOk(alloc, size_t{1} << 20, Kind::kScratch);
  std::fill(b.as<unsigned char>(), b.as<unsigned char>() + b.bytes(), 0x11);
  EXPECT_FALSE(b.DiscardToZero());
  EXPECT_TRUE(
      std::all_of(b.as<unsigned char>(), b.as<unsigned char>() + b.bytes(), [](unsigned char c) { return c == 0x11; }));
}

TEST(BufferView, SliceKeepsTierAndOffsets) {
  HostAllocator alloc(Tier::kPinnedHost, kUnlimited, nullptr);
  Buffer b = AllocOk(alloc, 256, Kind::kScratch);
  const BufferView s = b.view().Slice(64, 32);
  EXPECT_EQ(s.data, static_cast<char*>(b.data()) + 64);
  EXPECT_EQ(s.bytes, 32u);
  EXPECT_EQ(s.tier, Tier::kPinnedHost);
  EXPECT_EQ(s.as<float>(), reinterpret_cast<float*>(static_cast<char*>(b.data()) + 64));
}

TEST(MemoryTracker, CountsCurrentAndPeakPerTierAndPerKind) {
  MemoryTracker tracker;
  HostAllocator device(Tier::kDevice, kUnlimited, &tracker);
  HostAllocator host(Tier::kPinnedHost, kUnlimited, &tracker);
  Buffer p = AllocOk(device, 100, Kind::kParamShard);
  Buffer g = AllocOk(device, 200, Kind::kGradShard);
  Buffer m = AllocOk(host, 400, Kind::kMaster);
  EXPECT_EQ(tracker.tier(Tier::kDevice).current_bytes, 300u);
  EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, 300u);
  EXPECT_EQ(tracker.tier(Tier::kPinnedHost).current_bytes, 400u);
  EXPECT_EQ(tracker.tier(Tier::kNvme).peak_bytes, 0u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kParamShard).current_bytes, 100u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGradShard).current_bytes, 200u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kMaster).current_bytes, 0u) << "master lives on the host tier";
  EXPECT_EQ(tracker.kind(Tier::kPinnedHost, Kind::kMaster).current_bytes, 400u);

  p.Reset();
  Buffer s = AllocOk(device, 50, Kind::kScratch);
  // Tier peak is the peak of the tier total (300), not the sum of per-kind peaks (100 + 200 + 50).
  EXPECT_EQ(tracker.tier(Tier::kDevice).current_bytes, 250u);
  EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, 300u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kParamShard).current_bytes, 0u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kParamShard).peak_bytes, 100u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kScratch).peak_bytes, 50u);
}

TEST(MemoryTracker, ResetPeaksSetsPeaksToCurrent) {
  MemoryTracker tracker;
  HostAllocator device(Tier::kDevice, kUnlimited, &tracker);
  Buffer a = AllocOk(device, 1000, Kind::kGathered);
  Buffer b = AllocOk(device, 24, Kind::kGradWorking);
  a.Reset();
  tracker.ResetPeaks();
  EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, 24u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGathered).peak_bytes, 0u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGradWorking).peak_bytes, 24u);
  Buffer c = AllocOk(device, 76, Kind::kGathered);
  EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, 100u);
  EXPECT_EQ(tracker.kind(Tier::kDevice, Kind::kGathered).peak_bytes, 76u);
}

TEST(Allocator, ConcurrentAllocationsNeverExceedTheBudget) {
  // Two threads grab 64-byte blocks until refused, while a third watches the counters. Together they
  // must end up holding exactly the budget: never more (the reservation is atomic), never less (a
  // refusal only happens when the budget is full).
  constexpr uint64_t kBlock = 64, kBudget = 64 * kBlock * 16;
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, kBudget, &tracker);
  for (int round = 0; round < 20; ++round) {
    std::vector<Buffer> held[2];
    std::atomic<bool> done{false};
    std::atomic<uint64_t> max_seen{0};
    std::thread watcher([&] {
      while (!done.load()) {
        const uint64_t u = std::max(alloc.used_bytes(), tracker.tier(Tier::kDevice).current_bytes);
        if (u > max_seen.load()) max_seen = u;
      }
    });
    std::vector<std::thread> workers;
    for (int t = 0; t < 2; ++t) {
      workers.emplace_back([&, t] {
        while (true) {
          auto b = alloc.Allocate(kBlock, Kind::kScratch);
          if (!b.ok()) return;
          held[t].push_back(std::move(b).value());
        }
      });
    }
    for (auto& w : workers) w.join();
    done = true;
    watcher.join();
    const uint64_t total = (held[0].size() + held[1].size()) * kBlock;
    EXPECT_EQ(total, kBudget) << "round " << round << ": thread 0 holds " << held[0].size() << ", thread 1 holds "
                              << held[1].size() << " blocks";
    EXPECT_LE(max_seen.load(), kBudget) << "round " << round;
    EXPECT_EQ(tracker.tier(Tier::kDevice).peak_bytes, kBudget) << "round " << round;
    held[0].clear();
    held[1].clear();
    EXPECT_EQ(alloc.used_bytes(), 0u) << "round " << round;
    tracker.ResetPeaks();
  }
}

TEST(MemoryTracker, PeakNeverExceedsTheBudgetUnderConcurrentAllocateAndFree) {
  // Two threads churn blocks against a budget that is nearly always full. A freed block may be
  // re-allocated by the other thread at once; the tracker must never count it twice (its peak is what
  // the analytic memory tests compare with the budget).
  constexpr uint64_t kBlock = 64, kBudget = 3 * kBlock;
  MemoryTracker tracker;
  HostAllocator alloc(Tier::kDevice, kBudget, &tracker);
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 200000; ++i) {
        auto a = alloc.Allocate(kBlock, Kind::kScratch);
        auto b = alloc.Allocate(kBlock, Kind::kScratch);
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_LE(tracker.tier(Tier::kDevice).peak_bytes, kBudget)
      << "tracker peak " << tracker.tier(Tier::kDevice).peak_bytes << " exceeds the budget " << kBudget;
  EXPECT_LE(tracker.kind(Tier::kDevice, Kind::kScratch).peak_bytes, kBudget);
  EXPECT_EQ(tracker.tier(Tier::kDevice).current_bytes, 0u);
  EXPECT_EQ(alloc.used_bytes(), 0u);
}

}  // namespace
}  // namespace strata::memory
