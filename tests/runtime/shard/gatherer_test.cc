// The stage-3 gather over each parameter source: in-process communicators, host streams. Shards in
// memory gather bit for bit across ranks; a demand gather without a free buffer names the holders and a
// read-ahead one is not issued; the staged source copies into the rank's own block first and a failed
// copy fails the gather; the NVMe-cached source sends the cached shard, reads ahead, and names the unit whose
// shard cannot be read.
#include "runtime/shard/gatherer.h"

#include <cstring>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "tests/offload/offload_test_util.h"
#include "tests/runtime/memory/hooked_tier_ops.h"

namespace strata::shard {
namespace {

using ::testing::HasSubstr;

constexpr size_t kShard = 5;  // fp32 elements per rank

// One rank's gatherer over `units` units, each rank's shard of unit u holding 1000 u + 100 rank + i.
struct Rank {
  Rank(comm::Communicator* c, int units, int slots, std::function<std::unique_ptr<ParamSource>(Rank&)> source) {
    for (int u = 0; u < units; ++u) {
      shards.emplace_back();
      for (size_t i = 0; i < kShard; ++i) shards.back().push_back(float(1000 * u + 100 * c->rank() + i));
      meta.push_back({"unit" + std::to_string(u), kShard});
    }
    auto pool = SlotPool::Create(alloc, slots, kShard * c->size() * 4, memory::Kind::kGathered);
    EXPECT_TRUE(pool.ok()) << pool.status();
    stream = std::make_unique<device::HostStream>("gather");
    timeline.SetEnabled(true);
    gatherer =
        std::make_unique<Gatherer>(*std::move(pool), meta, source(*this),
                                   GathererOptions{c, stream.get(), DType::kF32, c->rank(), &timeline, &comm_ns});
  }
  std::unique_ptr<ParamSource> Memory() {
    std::vector<const void*> where;
    for (const std::vector<float>& s : shards) where.push_back(s.data());
    return MakeMemorySource(std::move(where));
  }
  std::vector<float> Gathered(int unit) const {
    const float* p = reinterpret_cast<const float*>(gatherer->data(unit));
    return p == nullptr ? std::vector<float>() : std::vector<float>(p, p + kShard * (gathered_ranks));
  }

  memory::HostAllocator alloc{memory::Tier::kDevice, memory::kUnlimited, nullptr};
  std::vector<std::vector<float>> shards;
  std::vector<GatherUnit> meta;
  device::Timeline timeline;
  int64_t comm_ns = 0, io_ns = 0;
  int gathered_ranks = 1;
  std::unique_ptr<device::Stream> stream;
  std::unique_ptr<Gatherer> gatherer;
};

std::vector<float> Expected(int unit, int ranks) {
  std::vector<float> v;
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < kShard; ++i) v.push_back(float(1000 * unit + 100 * r + i));
  }
  return v;
}

TEST(Gatherer, MemoryShardsGatherBitForBitOnEveryRank) {
  auto comms = comm::CreateInProcessGroup(2, {});
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> got(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Rank rank(comms[r].get(), 2, 2, [](Rank& me) { return me.Memory(); });
      rank.gathered_ranks = 2;
      ASSERT_TRUE(rank.gatherer->Issue(1, /*demand=*/true).ok());
      ASSERT_TRUE(rank.gatherer->Ensure(1).ok());
      got[r] = rank.Gathered(1);
      rank.gatherer->Release(1);
      EXPECT_FALSE(rank.gatherer->gathered(1));
      EXPECT_EQ(rank.gatherer->data(1), nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], Expected(1, 2));
  EXPECT_EQ(got[1], Expected(1, 2));
}

TEST(Gatherer, ADemandGatherWithoutAFreeBufferNamesTheHoldersAReadAheadWaits) {
  auto comms = comm::CreateInProcessGroup(1, {});
  Rank rank(comms[0].get(), 3, 1, [](Rank& me) { return me.Memory(); });
  ASSERT_TRUE(rank.gatherer->Ensure(0).ok());
  const int others[] = {1, 2};
  rank.gatherer->Prefetch(others, {});  // no free buffer: not issued, not an error
  EXPECT_FALSE(rank.gatherer->gathered(1));
  absl::Status s = rank.gatherer->Issue(2, /*demand=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unit 'unit2' needs a gathered buffer"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("held by units [unit0]"));
  rank.gatherer->Release(0);
  rank.gatherer->Prefetch(others, {});  // now unit 1 takes the buffer ahead of its use
  EXPECT_TRUE(rank.gatherer->gathered(1));
  ASSERT_TRUE(rank.gatherer->Ensure(1).ok());
  EXPECT_EQ(rank.Gathered(1), Expected(1, 1));
}

// The staged source over memory shards, its copies through `ops.FromHostOn` on its own stream.
std::unique_ptr<ParamSource> Staged(Rank& me, memory::TierOps& ops) {
  device::HostDevice dev;
  auto s = MakeStagedSource(me.Memory(), std::make_unique<device::HostStream>("h2d"), dev, 1, ops, &me.timeline);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(Gatherer, StagedShardsAreCopiedIntoTheOwnBlockThenGatheredInPlace) {
  auto comms = comm::CreateInProcessGroup(1, {});
  std::vector<const void*> copied_to;
  memory::testing::HookedTierOps ops;
  ops.from_host_on = [&](device::Stream& s, void* dst, const void* host, size_t bytes) {
    copied_to.push_back(dst);
    s.Enqueue([=] {
      std::memcpy(dst, host, bytes);
      return absl::OkStatus();
    });
  };
  Rank rank(comms[0].get(), 2, 1, [&](Rank& me) { return Staged(me, ops); });
  ASSERT_TRUE(rank.gatherer->Ensure(1).ok());
  EXPECT_EQ(rank.Gathered(1), Expected(1, 1));
  ASSERT_EQ(copied_to.size(), 1u);
  EXPECT_EQ(copied_to[0], rank.gatherer->data(1));  // rank 0's block starts the gathered buffer
  ASSERT_TRUE(rank.stream->Synchronize().ok());  // the gather's span is a task after the gather
  std::vector<std::string> kinds;
  for (const device::Span& span : rank.timeline.Take()) kinds.push_back(span.kind);
  EXPECT_THAT(kinds, ::testing::IsSupersetOf({"h2d", "gather"}));
}

// On host streams the failed copy reaches the gather through the copy's event; on CUDA the gather does
// not know, and CheckCopies reports it (annotated) after the gather. Either way Ensure fails with it.
TEST(Gatherer, AFailedStagedCopyFailsTheGather) {
  auto comms = comm::CreateInProcessGroup(1, {});
  memory::testing::HookedTierOps ops;
  ops.from_host_on = [](device::Stream& s, void*, const void*, size_t) {
    s.Enqueue([] { return absl::InternalError("copy engine fault"); });
  };
  Rank rank(comms[0].get(), 1, 1, [&](Rank& me) { return Staged(me, ops); });
  absl::Status s = rank.gatherer->Ensure(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("copy engine fault"));
}

TEST(Gatherer, CachedShardsAreSentFromTheCacheAndAnUnreadableOneNamesItsUnit) {
  offload::testing::TempDir dir;
  std::unique_ptr<offload::IoQueue> queue;
  std::unique_ptr<offload::NvmeStore> store;
  offload::testing::MakeQueueAndStore(offload::IoBackend::kThreads, dir.path(), 1 << 20, &queue, &store);
  memory::HostAllocator pinned{memory::Tier::kPinnedHost, memory::kUnlimited, nullptr};
  auto pool = offload::PinnedPool::Create(
      {.buffer_count = 2, .buffer_bytes = kShard * 4, .pin = offload::PinMethod::kNone}, &pinned);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto cache = offload::ShardCache::Create(store.get(), pool->get(), {kShard * 4, kShard * 4, kShard * 4},
                                           memory::Kind::kParamShard);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto comms = comm::CreateInProcessGroup(1, {});
  Rank rank(comms[0].get(), 3, 1, [&](Rank& me) {
    return MakeCachedSource(cache->get(), 2, SourceEnv{{"unit0", "unit1", "unit2"}, &me.io_ns});
  });
  for (int u = 0; u < 2; ++u) {  // unit 2 is never written: its read is refused
    ASSERT_TRUE((*cache)->Write(u, [&](void* dst) {
      std::memcpy(dst, rank.shards[u].data(), kShard * 4);
      return absl::OkStatus();
    }).ok());
  }
  EXPECT_EQ(rank.gatherer->read_ahead_depth(), 2);
  ASSERT_TRUE(rank.gatherer->Ensure(1).ok());
  EXPECT_EQ(rank.Gathered(1), Expected(1, 1));
  rank.gatherer->Release(1);
  ASSERT_TRUE(rank.gatherer->Ensure(0).ok());
  EXPECT_EQ(rank.Gathered(0), Expected(0, 1));
  rank.gatherer->Release(0);
  // The failed read reaches the gather stream too; the read's own error, naming the unit, comes first.
  absl::Status s = rank.gatherer->Ensure(2);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("reading the parameter shard of unit 'unit2'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("before it was ever written"));
}

}  // namespace
}  // namespace strata::shard
