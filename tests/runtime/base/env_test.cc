// Tests for runtime/base/env: raw lookup, GetInt (fallback, parsing, an error naming the variable),
// the launcher rank / world-size precedence and the defaults of the STRATA_* knobs.
#include "runtime/base/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace strata::env {
namespace {

using ::testing::HasSubstr;

// Sets (or unsets) variables for one test and restores the previous values afterwards, so tests do
// not leak into each other or depend on the launcher that runs them.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }
  void Set(const std::string& name, const std::string& value) {
    Save(name);
    setenv(name.c_str(), value.c_str(), 1);
  }
  void Unset(const std::string& name) {
    Save(name);
    unsetenv(name.c_str());
  }

 private:
  void Save(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

const std::vector<std::string> kRankVars = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"};
const std::vector<std::string> kSizeVars = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};

TEST(EnvGet, ReturnsNulloptWhenUnsetAndTheValueWhenSet) {
  ScopedEnv env;
  env.Unset("STRATA_TEST_VAR");
  EXPECT_EQ(Get("STRATA_TEST_VAR"), std::nullopt);
  env.Set("STRATA_TEST_VAR", "");
  EXPECT_EQ(Get("STRATA_TEST_VAR"), std::optional<std::string>("")) << "set but empty is not unset";
  env.Set("STRATA_TEST_VAR", "hello world");
  EXPECT_EQ(Get("STRATA_TEST_VAR"), std::optional<std::string>("hello world"));
}

TEST(EnvGetInt, ReturnsTheFallbackWhenUnset) {
  ScopedEnv env;
  env.Unset("STRATA_TEST_INT");
  auto v = GetInt("STRATA_TEST_INT", -17);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, -17);
}

TEST(EnvGetInt, ParsesIntegersIncludingNegativeAndLarge) {
  ScopedEnv env;
  for (const auto& [text, value] : std::vector<std::pair<std::string, long long>>{
           {"42", 42}, {"-7", -7}, {"0", 0}, {"9000000000", 9000000000LL}}) {
    env.Set("STRATA_TEST_INT", text);
    auto v = GetInt("STRATA_TEST_INT", 1);
    ASSERT_TRUE(v.ok()) << "'" << text << "': " << v.status();
    EXPECT_EQ(*v, value) << "'" << text << "'";
  }
}

TEST(EnvGetInt, MalformedValueIsInvalidArgumentNamingTheVariableAndValue) {
  ScopedEnv env;
  for (const std::string text : {"12abc", "abc", "", "1.5", "99999999999999999999"}) {
    env.Set("STRATA_TEST_INT", text);
    auto v = GetInt("STRATA_TEST_INT", 1);
    ASSERT_FALSE(v.ok()) << "'" << text << "' parsed as " << *v;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("STRATA_TEST_INT")) << v.status();
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("'" + text + "'")) << v.status();
  }
}

TEST(LauncherRank, IsNulloptWithoutALauncher) {
  ScopedEnv env;
  for (const std::string& n : kRankVars) env.Unset(n);
  for (const std::string& n : kSizeVars) env.Unset(n);
  EXPECT_EQ(LauncherRank(), std::nullopt);
  EXPECT_EQ(LauncherWorldSize(), std::nullopt);
}

TEST(LauncherRank, PrefersOpenMpiOverSlurmOverTorchrun) {
  ScopedEnv env;
  for (const std::string& n : kRankVars) env.Unset(n);
  for (const std::string& n : kSizeVars) env.Unset(n);
  env.Set("RANK", "5");
  env.Set("WORLD_SIZE", "8");
  EXPECT_EQ(LauncherRank(), 5);
  EXPECT_EQ(LauncherWorldSize(), 8);
  env.Set("SLURM_PROCID", "3");
  env.Set("SLURM_NTASKS", "6");
  EXPECT_EQ(LauncherRank(), 3);
  EXPECT_EQ(LauncherWorldSize(), 6);
  env.Set("OMPI_COMM_WORLD_RANK", "1");
  env.Set("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_EQ(LauncherRank(), 1);
  EXPECT_EQ(LauncherWorldSize(), 4);
}

TEST(LauncherRank, SkipsAMalformedVariableForTheNextOne) {
  ScopedEnv env;
  for (const std::string& n : kRankVars) env.Unset(n);
  env.Set("OMPI_COMM_WORLD_RANK", "not-a-number");
  env.Set("PMI_RANK", "2");
  EXPECT_EQ(LauncherRank(), 2);
}

TEST(EnvKnobs, LogLevelAndCpuIsaHaveDefaultsAndFollowTheEnvironment) {
  ScopedEnv env;
  env.Unset("STRATA_LOG_LEVEL");
  env.Unset("STRATA_CPU_ISA");
  EXPECT_EQ(LogLevel(), "info");
  EXPECT_EQ(ForcedCpuIsa(), "");
  env.Set("STRATA_LOG_LEVEL", "debug");
  env.Set("STRATA_CPU_ISA", "scalar");
  EXPECT_EQ(LogLevel(), "debug");
  EXPECT_EQ(ForcedCpuIsa(), "scalar");
}

}  // namespace
}  // namespace strata::env
