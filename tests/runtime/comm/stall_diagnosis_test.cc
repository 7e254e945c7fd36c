// Tests for runtime/comm/stall_diagnosis: the collective wait and the liveness check together fit inside
// the configured timeout (the check once ran up to 5 s after it, so the rank was named after up to twice
// the timeout), and the wording follows what the check measured: a peer that never answered, one that
// answered late (stopped, then resumed: it once read "every rank answered"), or all at once; and a rank
// that was itself stopped measures the whole stop and blames it, not the order of collectives.
#include "runtime/comm/stall_diagnosis.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SplitTimeout, TheWholeDiagnosisFitsTheConfiguredTimeout) {
  for (int64_t t : std::vector<int64_t>{1, 2, 3, 10, 999, 2000, 3000, 60000, 600000, 1000000000000}) {
    const StallBudget b = SplitTimeout(t);
    EXPECT_EQ(b.collective_ms + b.liveness_ms, std::max<int64_t>(t, 1)) << t;
    EXPECT_GE(b.liveness_ms, 1) << t;
    EXPECT_LE(b.liveness_ms, 5000) << t;
    EXPECT_GE(b.collective_ms, 0) << t;
    EXPECT_LT(b.late_ms, std::max<int64_t>(b.liveness_ms, 21)) << t;
  }
  EXPECT_EQ(SplitTimeout(2000).collective_ms, 1500);
  EXPECT_EQ(SplitTimeout(60000).liveness_ms, 5000);
}

TEST(DescribeLiveness, APeerThatNeverAnsweredIsNamed) {
  const std::string s = DescribeLiveness({-1, -1, 3}, /*me=*/0, 500, 50);
  EXPECT_THAT(s, HasSubstr("rank(s) 1 did not respond to a liveness check within 500 ms"));
  EXPECT_THAT(s, Not(HasSubstr("every rank answered")));
  EXPECT_THAT(s, Not(HasSubstr("rank 2")));
}

TEST(DescribeLiveness, APeerThatAnsweredLateIsNamedWithTheDelay) {
  const std::string s = DescribeLiveness({-1, 850}, 0, 900, 50);
  EXPECT_THAT(s, HasSubstr("rank 1 did not answer for 850 ms, then answered"));
  EXPECT_THAT(s, Not(HasSubstr("every rank answered")));
  const std::string both = DescribeLiveness({4, -1, 0, 700}, 2, 800, 50);
  EXPECT_THAT(both, HasSubstr("rank(s) 1 did not respond"));
  EXPECT_THAT(both, HasSubstr("rank 3 did not answer for 700 ms"));
}

TEST(DescribeLiveness, PromptAnswersPointAtTheOrderOfCollectives) {
  const std::string s = DescribeLiveness({2, -1, 0, 50}, 1, 60, 50);
  EXPECT_THAT(s, HasSubstr("every rank answered a liveness check within 50 ms"));
  EXPECT_EQ(DescribeLiveness({-1}, 0, 0, 20).find("every rank answered"), 0u) << "a world of one";
}

TEST(DescribeOwnStop, ARankThatWasStoppedSaysSo) {
  EXPECT_EQ(DescribeOwnStop(1, 50), "");
  EXPECT_EQ(DescribeOwnStop(50, 50), "");
  EXPECT_FALSE(WasStopped(50, 50));
  EXPECT_TRUE(WasStopped(51, 50));
  EXPECT_THAT(DescribeOwnStop(8000, 50), HasSubstr("this rank itself did not run for at least 8000 ms"));
}

// The case found by stopping rank 1 (timeout 2000 ms: wait 1500, check 500, late 50) 12 ms into a
// reduce_scatter for 2.3 s: the error said "did not run for about 807 ms" (the overshoot past the 1500 ms
// deadline, not the stop) and "every rank answered ..., so the ranks disagree on the order of
// collectives", though rank 0 had timed out and aborted meanwhile. The stop is the largest gap between
// polls (2293 ms), longer than the whole timeout.
TEST(DescribeOwnStop, AStopLongerThanTheTimeoutIsMeasuredWholeAndNotReadAsDisorder) {
  const StallBudget b = SplitTimeout(2000);
  const int64_t gap = 2293;
  ASSERT_TRUE(WasStopped(gap, b.late_ms));
  const std::string s =
      DescribeOwnStop(gap, b.late_ms) + DescribeLiveness({0, -1}, 1, 0, b.late_ms, WasStopped(gap, b.late_ms));
  EXPECT_THAT(s, HasSubstr("this rank itself did not run for at least 2293 ms"));
  EXPECT_THAT(s, Not(HasSubstr("807")));
  EXPECT_THAT(s, Not(HasSubstr("every rank answered")));
  EXPECT_THAT(s, Not(HasSubstr("disagree on the order of collectives")));
  EXPECT_THAT(s, HasSubstr("the cause is this rank's own stop, not the order of collectives"));
  EXPECT_THAT(s, HasSubstr("the peers may have aborted meanwhile"));
}

// A short self-stop (inside the timeout) with every peer answering at once: still this rank's stop.
TEST(DescribeLiveness, PromptAnswersAfterASelfStopBlameTheStop) {
  const std::string s = DescribeLiveness({2, -1, 0}, 1, 3, 50, /*self_stopped=*/true);
  EXPECT_THAT(s, HasSubstr("every peer answered a liveness check within 50 ms, having timed out while this rank "
                           "was not running"));
  EXPECT_THAT(s, Not(HasSubstr("disagree")));
  EXPECT_EQ(DescribeOwnStop(300, 50).find("this rank itself did not run for at least 300 ms"), 0u);
}

// A self-stopped rank whose peer is gone names the peer and says it may have aborted meanwhile.
TEST(DescribeLiveness, AMissingPeerAfterASelfStopMayHaveAborted) {
  const std::string s = DescribeLiveness({-1, -1}, 1, 500, 50, /*self_stopped=*/true);
  EXPECT_THAT(s, HasSubstr("rank(s) 0 did not respond to a liveness check within 500 ms"));
  EXPECT_THAT(s, HasSubstr("the peers may have timed out and aborted while this rank was not running"));
  EXPECT_THAT(s, Not(HasSubstr("every")));
}

// The peer was stopped, this rank was not: the peer is named, and nothing speaks of this rank's stop.
TEST(DescribeLiveness, APeerStoppedIsNamedAndThisRankIsNotBlamed) {
  const std::string missing = DescribeLiveness({-1, -1}, 0, 500, 50, /*self_stopped=*/false);
  EXPECT_THAT(missing, HasSubstr("rank(s) 1 did not respond to a liveness check within 500 ms"));
  EXPECT_THAT(missing, Not(HasSubstr("this rank")));
  const std::string late = DescribeLiveness({-1, 420}, 0, 500, 50, /*self_stopped=*/false);
  EXPECT_THAT(late, HasSubstr("rank 1 did not answer for 420 ms, then answered"));
  EXPECT_THAT(late, Not(HasSubstr("this rank")));
  EXPECT_EQ(DescribeOwnStop(1, 50), "") << "a rank that kept polling";
}

}  // namespace
}  // namespace strata::comm
