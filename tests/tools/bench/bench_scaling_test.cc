// Tests for tools/bench_scaling: the scaling summary from two `bench step --json` objects.
#include "tools/bench/bench_scaling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata::tools {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Step(int ranks, double tokens_per_s, double sgemm) {
  return {{"model", "layers 2, d_model 64"}, {"ranks", ranks}, {"stage", 3}, {"micro_batch", 2}, {"seq_len", 32},
          {"tokens_per_s", tokens_per_s}, {"sgemm_gflops_per_rank", sgemm}};
}

TEST(BenchScaling, EfficiencyIsPerRankSamplesAgainstOneRank) {
  // 1 rank: 3200 tokens/s = 100 samples/s. 4 ranks: 9600 tokens/s = 300 samples/s = 75 per rank.
  auto s = SummariseScaling(Step(1, 3200, 10), Step(4, 9600, 8));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ranks, 4);
  EXPECT_DOUBLE_EQ(s->samples_per_s_1, 100);
  EXPECT_DOUBLE_EQ(s->samples_per_s_per_rank_n, 75);
  EXPECT_DOUBLE_EQ(s->efficiency, 0.75);
  EXPECT_DOUBLE_EQ(s->sgemm_ratio, 0.8);
}

TEST(BenchScaling, MissingSgemmLeavesRatioZero) {
  json one = Step(1, 3200, 10), many = Step(2, 6400, 10);
  many.erase("sgemm_gflops_per_rank");
  auto s = SummariseScaling(one, many);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->efficiency, 1.0);
  EXPECT_EQ(s->sgemm_ratio, 0);
}

TEST(BenchScaling, RejectsIncomparableOrIncompleteRuns) {
  json other = Step(2, 6400, 10);
  other["micro_batch"] = 4;
  EXPECT_THAT(SummariseScaling(Step(1, 3200, 10), other).status().message(), HasSubstr("'micro_batch'"));
  json broken = Step(2, 6400, 10);
  broken.erase("tokens_per_s");
  EXPECT_THAT(SummariseScaling(Step(1, 3200, 10), broken).status().message(), HasSubstr("'tokens_per_s'"));
  EXPECT_FALSE(SummariseScaling(Step(2, 3200, 10), Step(2, 3200, 10)).ok());  // first run must be 1 rank
}

}  // namespace
}  // namespace strata::tools
