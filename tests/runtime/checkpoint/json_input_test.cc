// The nesting bound is checked on the text before parsing, ignoring brackets inside strings; typed reads
// name the field and never throw on a wrong type.
#include "runtime/checkpoint/json_input.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(CheckJsonNesting, AllowsTheLimitAndRefusesOneMore) {
  EXPECT_TRUE(CheckJsonNesting(Nested(64), 64, "doc").ok());
  absl::Status s = CheckJsonNesting(Nested(65), 64, "doc");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("deeper than 64"));
  EXPECT_TRUE(CheckJsonNesting("{\"a\":{\"b\":[1,{}]},\"c\":[]}", 4, "doc").ok());
  EXPECT_FALSE(CheckJsonNesting("{\"a\":{\"b\":[1,{}]},\"c\":[]}", 3, "doc").ok());
}

TEST(CheckJsonNesting, IgnoresBracketsInsideStrings) {
  EXPECT_TRUE(CheckJsonNesting("[\"[[[[[[\", \"\\\"[[[[\"]", 1, "doc").ok());
  EXPECT_FALSE(CheckJsonNesting("[\"\\\\\", [[]]]", 2, "doc").ok()) << "an escaped backslash ends the escape";
}

TEST(ParseUntrustedJson, RefusesAHundredThousandNestedArraysWithoutCrashing) {
  auto j = ParseUntrustedJson(Nested(100000), "trainer");
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  auto ok = ParseUntrustedJson(Nested(kMaxJsonDepth), "trainer");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->dump(), Nested(kMaxJsonDepth));
  EXPECT_EQ(ParseUntrustedJson("{\"a\":", "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(JsonReader, WrongTypesAndRangesNameTheField) {
  const json j = json::parse(R"({"s":"5","neg":-1,"big":18446744073709551615,"f":1.5,"b":true,"crc":"0000001g"})");
  const JsonReader in("m.json");
  auto s = in.Int(j, "s", "trainer.s", 0, 10);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("m.json: field 'trainer.s' must be an integer"));
  EXPECT_FALSE(in.Int(j, "neg", "neg", 0, 10).ok());
  EXPECT_FALSE(in.Int(j, "big", "big", 0, INT64_MAX).ok());
  EXPECT_FALSE(in.Int(j, "f", "f", 0, 10).ok());
  EXPECT_FALSE(in.Int(j, "b", "b", 0, 10).ok());
  EXPECT_FALSE(in.Uint(j, "neg", "neg").ok());
  EXPECT_EQ(*in.Uint(j, "big", "big"), UINT64_MAX);
  EXPECT_FALSE(in.Str(j, "neg", "neg").ok());
  EXPECT_FALSE(in.Bool(j, "s", "s").ok());
  EXPECT_FALSE(in.Array(j, "s", "s").ok());
  EXPECT_THAT(std::string(in.Int(j, "missing", "missing", 0, 1).status().message()), HasSubstr("is missing"));
  EXPECT_FALSE(in.Hex32(j, "crc", "crc").ok());
  EXPECT_FALSE(in.Int(json::array(), "x", "x", 0, 1).ok()) << "a field of a non-object";
}

}  // namespace
}  // namespace strata::checkpoint
