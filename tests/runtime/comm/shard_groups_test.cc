// Tests for runtime/comm/shard_groups: the Split arguments of both layouts, and the groups they make
// over an in-process world.
#include "runtime/comm/shard_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;

TEST(ContiguousGroups, RankRIsShardRankRModGOfGroupRDivG) {
  for (int r = 0; r < 6; ++r) {
    auto g = ContiguousGroups(6, r, 2);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->group_size, 2);
    EXPECT_EQ(g->replicas, 3);
    EXPECT_EQ(g->shard_color, r / 2);
    EXPECT_EQ(g->replica_color, r % 2);
  }
}

TEST(ContiguousGroups, SizeThatDoesNotDivideTheWorldIsInvalid) {
  for (int bad : {0, 4, 7, -1}) {
    auto g = ContiguousGroups(6, 0, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(g.status())) << bad;
  }
  EXPECT_THAT(std::string(ContiguousGroups(6, 0, 4).status().message()), HasSubstr("does not divide the world of 6"));
}

TEST(GroupsByName, RanksOfOneHostFormAGroupInWorldRankOrder) {
  const std::vector<std::string> hosts = {"b", "a", "b", "a"};  // interleaved placement
  const int want_color[] = {0, 1, 0, 1}, want_shard_rank[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    auto g = GroupsByName(hosts, r);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->group_size, 2);
    EXPECT_EQ(g->replicas, 2);
    EXPECT_EQ(g->shard_color, want_color[r]) << r;
    EXPECT_EQ(g->replica_color, want_shard_rank[r]) << r;
  }
}

TEST(GroupsByName, UnequalHostsAreFailedPreconditionNamingThem) {
  auto g = GroupsByName({"a", "a", "b"}, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(g.status())) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("a: 2, b: 1"));
}

// One host: every rank of an in-process world is in one group, as ZeRO over the world.
TEST(GroupsByHost, OneHostIsOneGroupAndTheSplitsMakeIt) {
  auto comms = CreateInProcessGroup(3, Options{});
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      device::HostDevice dev;
      auto stream = dev.CreateStream("s");
      ASSERT_TRUE(stream.ok());
      auto g = GroupsByHost(*comms[r], **stream);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->group_size, 3);
      EXPECT_EQ(g->replicas, 1);
      auto shard = comms[r]->Split(g->shard_color, g->shard_key, "shard");
      auto replica = comms[r]->Split(g->replica_color, g->replica_key, "replica");
      ASSERT_TRUE(shard.ok() && replica.ok());
      EXPECT_EQ((*shard)->size(), 3);
      EXPECT_EQ((*shard)->rank(), r);
      EXPECT_EQ((*replica)->size(), 1);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace strata::comm
