// Tests for tools/train_options: integer flags are range-checked instead of narrowed (a micro-batch of
// 2^32 + 1 once ran as 1), each error names the flag and its allowed range, and a directory given as
// --config is a clear error naming the path.
#include "models/gpt/train/train_options.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::tools {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Error(const std::vector<std::string>& args) {
  auto o = ParseTrainOptions(args, 1);
  EXPECT_FALSE(o.ok()) << "accepted";
  return o.ok() ? "" : std::string(o.status().message());
}

TEST(ParseTrainOptions, IntegerFlagsAreNeverNarrowed) {
  EXPECT_THAT(
      Error({"--micro-batch", "4294967297"}),
      AllOf(HasSubstr("--micro-batch"), HasSubstr("train_micro_batch_size_per_gpu"), HasSubstr("<= 2147483647")));
  EXPECT_THAT(Error({"--grad-accum", "4294967297"}), AllOf(HasSubstr("--grad-accum"), HasSubstr("<= 2147483647")));
  EXPECT_THAT(Error({"--max-live-units", "4294967296"}), HasSubstr("--max-live-units"));
  EXPECT_THAT(Error({"--prefetch", "-4294967295"}), HasSubstr("--prefetch"));
  EXPECT_THAT(Error({"--inject-nonfinite-rank", "4294967296"}),
              HasSubstr("--inject-nonfinite-rank 4294967296 is out of range [0, 2147483647]"));
  EXPECT_THAT(Error({"--collective-timeout", "1e300"}), HasSubstr("--collective-timeout 1e300 is out of range"));
  EXPECT_THAT(Error({"--layers", "4294967297"}), HasSubstr("[1, 2^30]"));
  auto ok = ParseTrainOptions({"--micro-batch", "3", "--collective-timeout", "2.5"}, 1);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->engine.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(ok->engine.collective_timeout_ms, 2500);
}

TEST(ParseTrainOptions, OptimizerThreadsMapsToItsConfigKey) {
  auto ok = ParseTrainOptions({"--optimizer-threads", "3"}, 1);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->engine.optimizer_threads, 3);
  EXPECT_EQ(ParseTrainOptions({}, 1)->engine.optimizer_threads, 0);
  EXPECT_THAT(Error({"--optimizer-threads", "-1"}),
              AllOf(HasSubstr("--optimizer-threads"), HasSubstr("strata.optimizer_threads"), HasSubstr("[0, 256]")));
  EXPECT_THAT(Error({"--optimizer-threads", "1000"}), HasSubstr("--optimizer-threads"));
}

TEST(ParseTrainOptions, ADirectoryAsConfigIsNamed) {
  const std::string dir = ::testing::TempDir();
  EXPECT_THAT(Error({"--config", dir}), AllOf(HasSubstr("--config"), HasSubstr(dir), HasSubstr("is a directory")));
}

}  // namespace
}  // namespace strata::tools
