// Tests for runtime/comm/stall_diagnosis: the collective wait and the liveness check together fit inside
// the configured timeout (the check once ran up to 5 s after it, so the rank was named after up to twice
// the timeout), and the wording follows what the check measured: a peer that never answered, one that
// answered late (stopped, then resumed: it once read "every rank answered"), or all at once.
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

TEST(DescribeOwnOvershoot, ARankThatWasStoppedSaysSo) {
  EXPECT_EQ(DescribeOwnOvershoot(1501, 1500, 50), "");
  EXPECT_EQ(DescribeOwnOvershoot(1550, 1500, 50), "");
  EXPECT_THAT(DescribeOwnOvershoot(9500, 1500, 50), HasSubstr("this rank itself did not run for about 8000 ms"));
}

}  // namespace
}  // namespace strata::comm
