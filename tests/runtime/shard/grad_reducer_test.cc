// Gradient reduction into shards, two ranks over in-process communicators and host streams: the
// all-reduce reducer sums full gradients only on the last micro-batch; the reduce-scatter reducer adds
// each rank's part of the summed working buffers to its shard (directly or through staging), zeroes a
// working buffer it hands out, and names the unit that finds every buffer taken.
#include "runtime/shard/grad_reducer.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/memory/hooked_tier_ops.h"

namespace strata::shard {
namespace {

using ::testing::HasSubstr;

constexpr size_t kTotal = 8, kShardElems = 4;  // one unit per test, two ranks

// One rank's reducer state; `grads` is the full gradient (all-reduce) or this rank's shard.
struct Rank {
  explicit Rank(comm::Communicator* c, size_t grad_elems) : comm(c), grads(grad_elems, 1.0f) {}
  ReducerEnv Env() { return {comm, &stream, &device, &timeline, &comm_ns}; }
  std::vector<ReduceUnit> Units() {
    return {{"u", kTotal, kShardElems, grads.data()}, {"v", kTotal, kShardElems, other}};
  }
  std::unique_ptr<GradReducer> ReduceScatter(int slots, bool staged) {
    auto pool = SlotPool::Create(alloc, slots, kTotal * 4, memory::Kind::kGradWorking);
    auto scratch = alloc.Allocate(kShardElems * 4, memory::Kind::kScratch);
    EXPECT_TRUE(pool.ok() && scratch.ok());
    memory::Buffer staging;
    if (staged) staging = *alloc.Allocate(kShardElems * 4, memory::Kind::kScratch);
    ops.to_host_on = [this](device::Stream& s, void* host, const void* dev, size_t bytes) {
      ++staged_copies;
      s.Enqueue([=] {
        std::memcpy(host, dev, bytes);
        return absl::OkStatus();
      });
    };
    return MakeReduceScatterReducer(Units(), Env(), ReduceOps{&ops, &ops}, *std::move(pool), *std::move(scratch),
                                    std::move(staging));
  }

  comm::Communicator* comm;
  std::vector<float> grads;
  float other[kShardElems] = {};
  memory::HostAllocator alloc{memory::Tier::kDevice, memory::kUnlimited, nullptr};
  device::HostStream stream{"reduce"};
  device::HostDevice device;
  device::Timeline timeline;
  int64_t comm_ns = 0;
  int staged_copies = 0;
  memory::testing::HookedTierOps ops;  // host memory; counts the staged copies
};

// Runs body(rank) on two in-process ranks.
void OnTwoRanks(const std::function<void(comm::Communicator*)>& body) {
  auto comms = comm::CreateInProcessGroup(2, {});
  std::thread t0([&] { body(comms[0].get()); }), t1([&] { body(comms[1].get()); });
  t0.join();
  t1.join();
}

TEST(GradReducer, AllReduceSumsTheFullGradientOnTheLastMicroBatchOnly) {
  OnTwoRanks([](comm::Communicator* c) {
    Rank r(c, kTotal);
    auto reducer = MakeAllReduceReducer(r.Units(), r.Env());
    EXPECT_FALSE(reducer->reduces(false));
    EXPECT_TRUE(reducer->reduces(true));
    ASSERT_TRUE(reducer->Acquire(0).ok());
    EXPECT_EQ(reducer->working(0), r.grads.data());  // backward accumulates into the gradient itself
    for (size_t i = 0; i < kTotal; ++i) r.grads[i] = float(10 * c->rank() + i);
    ASSERT_TRUE(reducer->Reduce(0).ok());
    ASSERT_TRUE(reducer->Finish().ok());
    for (size_t i = 0; i < kTotal; ++i) EXPECT_EQ(r.grads[i], float(10 + 2 * i)) << i;
  });
}

void ReduceScatterAccumulatesIntoTheShard(bool staged) {
  OnTwoRanks([staged](comm::Communicator* c) {
    Rank r(c, kShardElems);
    auto reducer = r.ReduceScatter(2, staged);
    EXPECT_TRUE(reducer->reduces(false));
    for (int micro = 0; micro < 2; ++micro) {
      ASSERT_TRUE(reducer->Acquire(0).ok());
      float* w = reducer->working(0);
      ASSERT_NE(w, nullptr);
      for (size_t i = 0; i < kTotal; ++i) w[i] += float(100 * c->rank() + i);  // onto a zeroed buffer
      ASSERT_TRUE(reducer->Reduce(0).ok());
      EXPECT_EQ(reducer->working(0), nullptr);
    }
    ASSERT_TRUE(reducer->Finish().ok());
    // Shard element j of rank r is global element 4r + j: 1 + 2 micro-batches x (i + (100 + i)).
    for (size_t j = 0; j < kShardElems; ++j) {
      const size_t i = kShardElems * c->rank() + j;
      EXPECT_EQ(r.grads[j], 1.0f + 2 * float(100 + 2 * i)) << j;
    }
    EXPECT_EQ(r.staged_copies, staged ? 2 : 0);
  });
}

TEST(GradReducer, ReduceScatterAddsEachRanksPartToItsShard) { ReduceScatterAccumulatesIntoTheShard(false); }
TEST(GradReducer, ReduceScatterThroughStagingGivesTheSameShard) { ReduceScatterAccumulatesIntoTheShard(true); }

TEST(GradReducer, AUnitThatFindsEveryWorkingBufferTakenIsNamed) {
  auto comms = comm::CreateInProcessGroup(1, {});
  Rank r(comms[0].get(), kShardElems);
  auto reducer = r.ReduceScatter(1, false);
  ASSERT_TRUE(reducer->Acquire(0).ok());
  absl::Status s = reducer->Acquire(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unit 'v' needs a gradient buffer"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_live_units=1"));
}

// Note [Idle pages], strata.optimizer_in_backward (no gradient shards): the scratch holds the reduced shard
// for the caller until ReleaseIdle, which then hands its pages back; the next reduction writes it whole.
TEST(GradReducer, WithoutShardsReleaseIdleHandsTheReadScratchBack) {
  constexpr size_t kElems = 1 << 20;  // 4 MiB: whole pages
  auto comms = comm::CreateInProcessGroup(1, {});
  memory::HostAllocator alloc{memory::Tier::kDevice, memory::kUnlimited, nullptr};
  device::HostStream stream{"reduce"};
  device::HostDevice device;
  device::Timeline timeline;
  int64_t comm_ns = 0;
  auto pool = SlotPool::Create(alloc, 1, kElems * 4, memory::Kind::kGradWorking);
  auto scratch = alloc.Allocate(kElems * 4, memory::Kind::kScratch);
  ASSERT_TRUE(pool.ok() && scratch.ok());
  memory::testing::HookedTierOps host;
  const ReduceOps ops{&host, nullptr};  // no gradient shards
  auto reducer = MakeReduceScatterReducer({{"u", kElems, kElems, nullptr}},
                                          {comms[0].get(), &stream, &device, &timeline, &comm_ns}, ops,
                                          *std::move(pool), *std::move(scratch), memory::Buffer{});
  for (float value : {3.0f, 5.0f}) {
    ASSERT_TRUE(reducer->Acquire(0).ok());
    float* w = reducer->working(0);
    std::fill(w, w + kElems, value);
    ASSERT_TRUE(reducer->Reduce(0).ok());
    ASSERT_TRUE(reducer->Finish().ok());
    const float* shard = reducer->reduced();
    ASSERT_NE(shard, nullptr);
    EXPECT_EQ(shard[0], value);
    EXPECT_EQ(shard[kElems - 1], value);
    EXPECT_EQ(memory::ResidentBytes(shard, kElems * 4).resident, memory::ResidentBytes(shard, kElems * 4).whole);
    reducer->ReleaseIdle();
    const memory::Residency after = memory::ResidentBytes(shard, kElems * 4);
    ASSERT_GT(after.whole, kElems * 3);
    EXPECT_EQ(after.resident, 0u) << "the scratch kept its pages";
  }
}

}  // namespace
}  // namespace strata::shard
