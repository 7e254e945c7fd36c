#include "runtime/shard/schedule.h"

#include "gtest/gtest.h"

namespace strata::shard {
namespace {

Schedule Recorded() {
  Schedule s({"emb", "b0", "b1"});
  for (int u : {0, 1, 2, 0}) EXPECT_TRUE(s.Observe(Phase::kForward, u).ok());
  for (int u : {0, 2, 1, 0}) EXPECT_TRUE(s.Observe(Phase::kBackward, u).ok());
  EXPECT_TRUE(s.EndMicroBatch().ok());
  return s;
}

TEST(Schedule, RecordsTheFirstMicroBatchAndAcceptsRepeats) {
  Schedule s = Recorded();
  EXPECT_TRUE(s.recorded());
  EXPECT_EQ(s.uses().size(), 8u);
  for (int u : {0, 1, 2, 0}) EXPECT_TRUE(s.Observe(Phase::kForward, u).ok());
  for (int u : {0, 2, 1, 0}) EXPECT_TRUE(s.Observe(Phase::kBackward, u).ok());
  EXPECT_TRUE(s.EndMicroBatch().ok());
}

TEST(Schedule, DifferentUnitIsAnErrorNamingBoth) {
  Schedule s = Recorded();
  ASSERT_TRUE(s.Observe(Phase::kForward, 0).ok());
  absl::Status st = s.Observe(Phase::kForward, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("forward of unit 'b1'"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("forward of unit 'b0'"), absl::string_view::npos) << st;
}

TEST(Schedule, ExtraAndMissingUsesAreErrors) {
  Schedule s = Recorded();
  for (int u : {0, 1, 2, 0}) ASSERT_TRUE(s.Observe(Phase::kForward, u).ok());
  absl::Status st = s.EndMicroBatch();
  EXPECT_NE(st.message().find("4 of the 8"), absl::string_view::npos) << st;
  Schedule t = Recorded();
  for (int u : {0, 1, 2, 0}) ASSERT_TRUE(t.Observe(Phase::kForward, u).ok());
  for (int u : {0, 2, 1, 0}) ASSERT_TRUE(t.Observe(Phase::kBackward, u).ok());
  EXPECT_NE(t.Observe(Phase::kBackward, 1).message().find("extra"), absl::string_view::npos);
}

TEST(Schedule, UpcomingListsDistinctNextUnitsWithinTheMicroBatch) {
  Schedule s({"a", "b", "c"});
  EXPECT_TRUE(s.Upcoming(2, 0).empty()) << "nothing is known before the record is frozen";
  s = Recorded();
  ASSERT_TRUE(s.Observe(Phase::kForward, 0).ok());
  EXPECT_EQ(s.Upcoming(1, 0), std::vector<int>({1}));
  EXPECT_EQ(s.Upcoming(5, 0), std::vector<int>({1, 2}));
  for (int u : {1, 2, 0}) ASSERT_TRUE(s.Observe(Phase::kForward, u).ok());
  EXPECT_EQ(s.Upcoming(2, 0), std::vector<int>({2, 1})) << "crosses into the backward phase";
  EXPECT_EQ(s.BackwardUsesAfterPosition(0), 2);
}

}  // namespace
}  // namespace strata::shard
