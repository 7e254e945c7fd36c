// shard::ParamStorage: a range of a unit's parameter storage in host memory. In place where the CPU reaches
// the tier; through a host copy of only that range on a tier it does not (read first with keep, written
// back on Close(true), left alone on Close(false)); through the NVMe shard cache, where a part of a shard
// keeps the rest and an unwritten close leaves the shard as it was. An empty range is nullptr, and a
// second Open before Close is refused.
#include "runtime/shard/param_storage.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/offload/offload_test_util.h"
#include "tests/runtime/memory/hooked_tier_ops.h"

namespace strata::shard {
namespace {

std::vector<char> Bytes(size_t n, char first) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(first + i);
  return v;
}

TEST(ParamStorage, AHostVisibleRangeIsHandedOutInPlace) {
  memory::testing::HookedTierOps host;
  std::vector<char> params = Bytes(64, 1);
  ParamStorage storage;
  auto p = storage.Open({&host, nullptr, 0, params.data(), 64, 16, 8}, /*keep=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, params.data() + 16);
  EXPECT_EQ(storage.Open({&host, nullptr, 0, params.data(), 64, 0, 8}, false).status().code(),
            absl::StatusCode::kInternal);  // one range at a time
  ASSERT_TRUE(storage.Close(true).ok());
  auto empty = storage.Open({&host, nullptr, 0, params.data(), 64, 0, 0}, true);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, nullptr);
  ASSERT_TRUE(storage.Close(true).ok());
}

TEST(ParamStorage, ADeviceRangeGoesThroughAHostCopyOfThatRangeOnly) {
  memory::testing::HookedTierOps device;  // host memory that claims the CPU cannot reach it
  device.visible = false;
  std::vector<char> params = Bytes(64, 1);
  const std::vector<char> before = params;
  ParamStorage storage;
  for (bool written : {false, true}) {
    auto p = storage.Open({&device, nullptr, 0, params.data(), 64, 16, 8}, /*keep=*/true);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(*p, params.data() + 16);                          // a copy
    EXPECT_EQ(0, std::memcmp(*p, params.data() + 16, 8));       // read first (keep)
    std::memset(*p, 'x', 8);
    ASSERT_TRUE(storage.Close(written).ok());
    std::vector<char> want = before;
    if (written) std::memset(want.data() + 16, 'x', 8);
    EXPECT_EQ(params, want) << written;
  }
}

TEST(ParamStorage, NvmeShardsGoThroughTheCacheAndAPartKeepsTheRest) {
  using offload::testing::FillPattern;
  using offload::testing::FirstMismatch;
  constexpr uint64_t kBytes = 4096 + 100;
  offload::testing::TempDir dir;
  std::unique_ptr<offload::IoQueue> queue;
  std::unique_ptr<offload::NvmeStore> store;
  offload::testing::MakeQueueAndStore(offload::IoBackend::kThreads, dir.path(), 1 << 20, &queue, &store);
  if (HasFatalFailure()) return;
  memory::HostAllocator alloc{memory::Tier::kPinnedHost, memory::kUnlimited, nullptr};
  auto pool = offload::PinnedPool::Create({.buffer_count = 1, .buffer_bytes = kBytes, .pin = offload::PinMethod::kNone},
                                          &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto cache = offload::ShardCache::Create(store.get(), pool->get(), {kBytes, kBytes}, memory::Kind::kParamShard);
  ASSERT_TRUE(cache.ok()) << cache.status();
  memory::testing::HookedTierOps host;
  ParamStorage storage;
  // The whole shard 0, then 8 bytes of it (the rest kept), then an unwritten close (nothing changes).
  auto p = storage.Open({&host, cache->get(), 0, nullptr, kBytes, 0, kBytes}, /*keep=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  FillPattern(*p, kBytes, 3);
  ASSERT_TRUE(storage.Close(true).ok());
  p = storage.Open({&host, cache->get(), 0, nullptr, kBytes, 100, 8}, /*keep=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0, 8);
  ASSERT_TRUE(storage.Close(true).ok());
  p = storage.Open({&host, cache->get(), 0, nullptr, kBytes, 0, kBytes}, /*keep=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 1, kBytes);
  ASSERT_TRUE(storage.Close(false).ok());
  // Shard 1 evicts shard 0 (one buffer), which comes back from NVMe.
  p = storage.Open({&host, cache->get(), 1, nullptr, kBytes, 0, kBytes}, false);
  ASSERT_TRUE(p.ok()) << p.status();
  FillPattern(*p, kBytes, 4);
  ASSERT_TRUE(storage.Close(true).ok());
  auto lease = (*cache)->Pin(0);
  ASSERT_TRUE(lease.ok() && lease->ready().Wait().ok());
  const char* got = static_cast<const char*>(lease->data());
  EXPECT_EQ(FirstMismatch(got, 100, 3), -1);
  for (int i = 100; i < 108; ++i) EXPECT_EQ(got[i], 0) << i;
  for (size_t i = 108; i < kBytes; ++i) ASSERT_EQ(got[i], offload::testing::PatternByte(3, i)) << i;  // kept
}

}  // namespace
}  // namespace strata::shard
