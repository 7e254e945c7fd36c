#include "runtime/shard/slot_pool.h"

#include <algorithm>
#include <future>
#include <random>

#include "gtest/gtest.h"
#include "runtime/device/host_device.h"

namespace strata::shard {
namespace {

TEST(SlotPool, HandsOutEachSlotOnceAndAccountsTheBytes) {
  memory::MemoryTracker tracker;
  memory::HostAllocator alloc(memory::Tier::kDevice, memory::kUnlimited, &tracker);
  auto pool = SlotPool::Create(alloc, 2, 1024, memory::Kind::kGathered);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(tracker.kind(memory::Tier::kDevice, memory::Kind::kGathered).current_bytes, 2048u);
  const int a = pool->TryAcquire(7), b = pool->TryAcquire(8);
  EXPECT_NE(a, b);
  EXPECT_EQ(pool->TryAcquire(9), -1);
  EXPECT_EQ(pool->live(), 2);
  EXPECT_EQ(pool->owner(a), 7);
  pool->Release(a, nullptr);
  EXPECT_EQ(pool->TryAcquire(9), a);
}

TEST(SlotPool, NextOwnerWaitsForTheReleaseFence) {
  memory::HostAllocator alloc(memory::Tier::kDevice, memory::kUnlimited, nullptr);
  auto pool = SlotPool::Create(alloc, 1, 64, memory::Kind::kGradWorking);
  ASSERT_TRUE(pool.ok());
  device::HostStream stream("reduce");
  std::atomic<bool> reader_done{false};
  const int s = pool->TryAcquire(1);
  stream.Enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow reader of the slot
    reader_done = true;
    return absl::OkStatus();
  });
  auto fence = std::make_shared<device::HostEvent>();
  stream.Record(*fence);
  pool->Release(s, fence);
  ASSERT_EQ(pool->TryAcquire(2), s);
  ASSERT_TRUE(pool->WaitFence(s).ok());
  EXPECT_TRUE(reader_done) << "WaitFence returned before the previous owner's last use finished";
}

// Note [Idle pages]: ReleaseIdle hands a free slot's pages back once its fence is done, never before, and
// never while a new owner holds it, whatever fence was pending when it was taken.
TEST(SlotPool, ReleaseIdleHandsBackAFreeSlotOnceItsFenceIsDone) {
  constexpr size_t kBytes = size_t{4} << 20;
  memory::HostAllocator alloc(memory::Tier::kDevice, memory::kUnlimited, nullptr);
  auto pool = SlotPool::Create(alloc, 1, kBytes, memory::Kind::kGradWorking);
  ASSERT_TRUE(pool.ok());
  auto fill = [&](int slot, unsigned char v) {
    auto* p = static_cast<unsigned char*>(pool->view(slot).data);
    std::fill(p, p + kBytes, v);
  };
  // The slot's whole pages: all resident, or none.
  const size_t whole = memory::ResidentBytes(pool->view(0).data, kBytes).whole;
  ASSERT_GE(whole, kBytes - 8192);
  auto resident = [&](int slot) { return memory::ResidentBytes(pool->view(slot).data, kBytes).resident; };
  const int s = pool->TryAcquire(1);
  fill(s, 0x5A);
  device::HostStream stream("reduce");
  auto pending_reader = [&stream](std::promise<void>& go) {  // a reader of the slot that has not finished
    std::shared_future<void> gate = go.get_future().share();
    stream.Enqueue([gate] {
      gate.wait();
      return absl::OkStatus();
    });
    auto fence = std::make_shared<device::HostEvent>();
    stream.Record(*fence);
    return fence;
  };
  std::promise<void> go;
  auto fence = pending_reader(go);
  pool->Release(s, fence);
  pool->ReleaseIdle();
  EXPECT_EQ(resident(s), whole) << "handed back while its last reader may still read it";
  go.set_value();
  ASSERT_TRUE(fence->Synchronize().ok());
  pool->ReleaseIdle();
  EXPECT_EQ(resident(s), 0u) << "a free slot whose fence is done keeps its pages";
  // Taken again before its fence is done, it is the owner's: the fence completing does not hand it back.
  ASSERT_EQ(pool->TryAcquire(2), s);
  fill(s, 0x77);
  std::promise<void> go2;
  auto fence2 = pending_reader(go2);
  pool->Release(s, fence2);
  ASSERT_EQ(pool->TryAcquire(3), s);
  fill(s, 0x33);
  go2.set_value();
  ASSERT_TRUE(fence2->Synchronize().ok());
  pool->ReleaseIdle();
  EXPECT_EQ(resident(s), whole) << "an owned slot was handed back";
  auto* p = static_cast<unsigned char*>(pool->view(s).data);
  EXPECT_TRUE(std::all_of(p, p + kBytes, [](unsigned char c) { return c == 0x33; })) << "the owner's bytes changed";
  pool->Release(s, nullptr);  // no fence
  EXPECT_EQ(resident(s), whole) << "Release alone hands nothing back";
  pool->ReleaseIdle();
  EXPECT_EQ(resident(s), 0u);
}

TEST(SlotPool, OverBudgetPoolFails) {
  memory::HostAllocator alloc(memory::Tier::kDevice, 1000, nullptr);
  auto pool = SlotPool::Create(alloc, 2, 600, memory::Kind::kGathered);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.used_bytes(), 0u) << "a failed pool must give back what it took";
}

// GPT-2 124M at stage 3 over 2 ranks: the root (tied wte, wpe, ln_f) is 5.6x a block.
TEST(PlanSlots, AnOutsizedUnitGetsOneSlotOfItsOwn) {
  constexpr size_t kRoot = 39'385'344, kBlock = 7'087'872;
  std::vector<SlotUnit> units = {{0, kRoot}};
  for (int b = 1; b <= 12; ++b) units.push_back({b, kBlock});
  const SlotPlan plan = PlanSlots(units, 3);
  EXPECT_EQ(plan.live, 3);
  EXPECT_EQ(plan.shared, 3);
  EXPECT_EQ(plan.shared_elems, kBlock);
  ASSERT_EQ(plan.own.size(), 1u);
  EXPECT_EQ(plan.own[0].unit, 0);
  EXPECT_EQ(plan.elems(), 3 * kBlock + kRoot);  // was 3 x kRoot
}

TEST(PlanSlots, EqualUnitsKeepLiveSlotsOfTheLargest) {
  const SlotPlan plan = PlanSlots({{0, 100}, {1, 100}, {2, 100}, {3, 90}}, 2);
  EXPECT_EQ(plan.shared, 2);
  EXPECT_EQ(plan.shared_elems, 100u);
  EXPECT_TRUE(plan.own.empty());
  EXPECT_EQ(plan.elems(), 200u);
}

TEST(PlanSlots, NeverMoreSlotsThanUnits) {
  const SlotPlan plan = PlanSlots({{0, 10}, {1, 30}}, 4);  // e.g. reshard_after_forward=false
  EXPECT_EQ(plan.live, 4);
  EXPECT_EQ(plan.elems(), 40u);
  EXPECT_EQ(PlanSlots({}, 3).elems(), 0u);  // every unit frozen: no gradient buffer
}

// Any acquire/release sequence that keeps at most `live` units holding slots succeeds, exactly as with
// `live` slots of the largest unit, each owner's slot holds its unit, and no two owners share a slot; the
// pool is never larger than the old one.
TEST(PlanSlots, EverySetOfLiveUnitsFits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8), live = 1 + static_cast<int>(rng() % 5);
    std::vector<SlotUnit> units;
    size_t largest = 0;
    for (int u = 0; u < n; ++u) {
      units.push_back({u, 1 + rng() % 6 * (rng() % 2 ? 1 : 9)});
      largest = std::max(largest, units.back().elems);
    }
    const SlotPlan plan = PlanSlots(units, live);
    ASSERT_LE(plan.elems(), uint64_t(live) * largest);
    memory::HostAllocator alloc(memory::Tier::kDevice, memory::kUnlimited, nullptr);
    auto pool = SlotPool::Create(alloc, plan, 4, memory::Kind::kGathered);
    ASSERT_TRUE(pool.ok());
    std::vector<int> slot(n, -1);
    for (int op = 0; op < 200; ++op) {
      const int u = static_cast<int>(rng() % n);
      if (slot[u] >= 0) {
        pool->Release(slot[u], nullptr);
        slot[u] = -1;
        continue;
      }
      const int held = pool->live();
      slot[u] = pool->TryAcquire(u);
      ASSERT_EQ(slot[u] >= 0, held < live) << "trial " << trial << ": unit " << u << " with " << held << " held";
      if (slot[u] < 0) continue;
      EXPECT_GE(pool->view(slot[u]).bytes, units[u].elems * 4);
      for (int v = 0; v < n; ++v) EXPECT_TRUE(v == u || slot[v] != slot[u]);
    }
  }
}

}  // namespace
}  // namespace strata::shard
