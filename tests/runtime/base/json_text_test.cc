// Tests for runtime/base/json_text: the nesting limit is enforced before parsing (a 100k-deep document is
// refused at once), brackets inside strings do not count, duplicate keys are errors naming their path at
// any depth, and malformed text keeps nlohmann's position without its exception prefix.
#include "runtime/base/json_text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::string Nested(int depth, const std::string& inner = "1") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += inner;
  for (int i = 0; i < depth; ++i) s += "}";
  return s;
}

TEST(ParseGuardedJson, RefusesNestingPastTheLimitBeforeParsing) {
  auto deep = ParseGuardedJson(Nested(100000), "config");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(deep.status().message()), HasSubstr("config JSON nests deeper than 64 levels (at byte 320)"));
  auto arrays = ParseGuardedJson(std::string(100000, '['), "header");
  ASSERT_FALSE(arrays.ok());
  EXPECT_THAT(std::string(arrays.status().message()), HasSubstr("header JSON nests deeper than 64"));
}

TEST(ParseGuardedJson, AcceptsTheLimitItselfAndIgnoresBracketsInStrings) {
  auto at_limit = ParseGuardedJson(Nested(64), "config");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_FALSE(ParseGuardedJson(Nested(65), "config").ok());
  const std::string brackets = "{\"k\": \"" + std::string(200, '[') + "\\\"" + std::string(200, '{') + "\"}";
  auto in_string = ParseGuardedJson(brackets, "config");
  ASSERT_TRUE(in_string.ok()) << in_string.status();
  EXPECT_EQ((*in_string)["k"].get<std::string>().size(), 401u);
}

TEST(ParseGuardedJson, DuplicateKeysAreErrorsNamingThePath) {
  auto top = ParseGuardedJson(R"({"wte.weight": 1, "b": 2, "wte.weight": 3})", "header");
  ASSERT_FALSE(top.ok());
  EXPECT_THAT(std::string(top.status().message()), HasSubstr("duplicate header key 'wte.weight'"));
  auto nested = ParseGuardedJson(R"({"optimizer": {"params": {"lr": 1, "eps": 2, "lr": 3}}})", "config");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(std::string(nested.status().message()), HasSubstr("duplicate config key 'optimizer.params.lr'"));
  auto in_array = ParseGuardedJson(R"({"list": [{"x": 1}, {"x": 2, "x": 3}]})", "config");
  ASSERT_FALSE(in_array.ok());
  EXPECT_THAT(std::string(in_array.status().message()), HasSubstr("'list.x'"));
  // The same key in sibling objects, or after its object closed, is not a duplicate.
  auto siblings = ParseGuardedJson(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})", "config");
  EXPECT_TRUE(siblings.ok()) << siblings.status();
}

TEST(ParseGuardedJson, MalformedTextKeepsThePosition) {
  auto bad = ParseGuardedJson("{\n \"a\": 1,\n}", "config");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("malformed config JSON: "));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(bad.status().message()), ::testing::Not(HasSubstr("[json.exception")));
  for (const char* text : {"", "\x80\xff", "{\"a\":", "nul", "[1,2"}) {
    EXPECT_FALSE(ParseGuardedJson(text, "x").ok()) << text;
  }
}

}  // namespace
}  // namespace strata
