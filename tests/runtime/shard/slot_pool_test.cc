#include "runtime/shard/slot_pool.h"

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

TEST(SlotPool, OverBudgetPoolFails) {
  memory::HostAllocator alloc(memory::Tier::kDevice, 1000, nullptr);
  auto pool = SlotPool::Create(alloc, 2, 600, memory::Kind::kGathered);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.used_bytes(), 0u) << "a failed pool must give back what it took";
}

}  // namespace
}  // namespace strata::shard
