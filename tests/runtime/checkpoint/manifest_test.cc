// ParseManifest on hostile text: every field's type, range and consistency is checked and named, and no
// input aborts (every prefix of a valid manifest included).
#include "runtime/checkpoint/manifest.h"

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/json_input.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

Manifest Valid() {
  Manifest m;
  m.step = 7;
  m.world_size = 2;
  m.stage = 3;
  m.param_dtype = "bf16";
  m.optimizer = "adamw";
  m.loss_scale = 1024;
  m.clean_steps = 3;
  m.units = {ManifestUnit{"u", {ManifestParam{"w", {2, 5}, 0, 10, true}, ManifestParam{"b", {3}, 12, 3, false}}}};
  m.shards = {{1, "shard_00001.bin", 4096 + 100, 0xdeadbeef}, {0, "shard_00000.bin", 4096 + 100, 0x01234567}};
  m.trainer_json = R"({"next_step":7,"data":"x"})";
  return m;
}

json ValidJson() { return json::parse(ToJson(Valid())); }

absl::Status Parse(const json& j) { return ParseManifest(j.dump(), "ckpt/manifest.json").status(); }

void ExpectBad(const json& j, const std::string& field) {
  absl::Status s = Parse(j);
  EXPECT_FALSE(s.ok()) << field;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ckpt/manifest.json")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field)) << s;
}

TEST(ParseManifest, RoundTripsAndSortsShardsByRank) {
  auto m = ParseManifest(ToJson(Valid()), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->loss_scale, 1024);
  ASSERT_EQ(m->shards.size(), 2u);
  EXPECT_EQ(m->shards[0].rank, 0);
  EXPECT_EQ(m->shards[0].file, "shard_00000.bin");
  EXPECT_EQ(m->shards[1].checksum, 0xdeadbeefu);
  EXPECT_EQ(m->units[0].params[1].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(json::parse(m->trainer_json), json::parse(Valid().trainer_json));
}

// fp16 hysteresis left (Note [Dynamic loss scale]): written when recorded, read back; absent is 0 (the restore
// then uses the configured hysteresis); below 1 is refused.
TEST(ParseManifest, LossScaleHysteresisRoundTripsAndIsOptional) {
  EXPECT_FALSE(ValidJson().contains("loss_scale_hysteresis"));
  auto plain = ParseManifest(ToJson(Valid()), "m.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->loss_scale_hysteresis, 0);
  Manifest m = Valid();
  m.loss_scale_hysteresis = 1;
  auto back = ParseManifest(ToJson(m), "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->loss_scale_hysteresis, 1);
  json j = ValidJson();
  j["loss_scale_hysteresis"] = 0;
  ExpectBad(j, "loss_scale_hysteresis");
  j["loss_scale_hysteresis"] = "two";
  ExpectBad(j, "loss_scale_hysteresis");
}

// Hybrid sharding (docs/decisions/0016): "replicas" is written only when > 1 and read back; absent is 1.
TEST(ParseManifest, ReplicasRoundTripAndDefaultToOne) {
  EXPECT_FALSE(ValidJson().contains("replicas")) << "a manifest without replicas is as before";
  auto plain = ParseManifest(ToJson(Valid()), "m.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->replicas, 1);
  Manifest m = Valid();
  m.replicas = 4;
  auto hybrid = ParseManifest(ToJson(m), "m.json");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  EXPECT_EQ(hybrid->replicas, 4);
  // 0 parses as an unsigned number: JsonReader::Int once checked only the upper bound of those.
  for (const json& bad : {json(0), json(-1), json("2"), json(1.5), json(kMaxWorldSize)}) {
    json j = ValidJson();
    j["replicas"] = bad;  // world_size 2 x replicas must stay within kMaxWorldSize ranks
    ExpectBad(j, "'replicas'");
  }
}

TEST(ParseManifest, WrongTypesAndNegativeNumbersAreErrorsNamingTheField) {
  for (const char* key : {"step", "world_size", "stage", "clean_steps", "version"}) {
    json j = ValidJson();
    j[key] = "5";
    ExpectBad(j, std::string("'") + key + "'");
    j[key] = -1;
    ExpectBad(j, std::string("'") + key + "'");
    j[key] = 1.5;
    ExpectBad(j, std::string("'") + key + "'");
  }
  json j = ValidJson();
  j["units"][0]["params"][0]["numel"] = "10";
  ExpectBad(j, "units[0].params[0].numel");
  j = ValidJson();
  j["units"][0]["params"][0]["shape"][1] = -5;
  ExpectBad(j, "units[0].params[0].shape[1]");
  j = ValidJson();
  j["units"][0]["params"][1]["weight_decay"] = 1;
  ExpectBad(j, "units[0].params[1].weight_decay");
  j = ValidJson();
  j["shards"][0]["crc32"] = "zzzzzzzz";
  ExpectBad(j, "shards[0].crc32");
  j = ValidJson();
  j["loss_scale"] = "big";
  ExpectBad(j, "loss_scale");
  j["loss_scale"] = 0;
  ExpectBad(j, "loss_scale");
  j = ValidJson();
  j["units"] = json::object();
  ExpectBad(j, "'units'");
  j = ValidJson();
  j["units"][0] = 3;
  ExpectBad(j, "units[0]");
  j = ValidJson();
  j["param_dtype"] = "fp8";
  ExpectBad(j, "param_dtype");
  j = ValidJson();
  j["optimizer"] = "lion";
  ExpectBad(j, "optimizer");
  j = ValidJson();
  j["stage"] = 4;
  ExpectBad(j, "'stage'");
}

TEST(ParseManifest, SizesAreCheckedBeforeAnythingIsAllocated) {
  json j = ValidJson();  // 2^62 elements: numel * 4 bytes * 3 kinds overflows 64 bits
  j["units"][0]["params"][1]["shape"] = {uint64_t{1} << 31, uint64_t{1} << 31};
  j["units"][0]["params"][1]["numel"] = uint64_t{1} << 62;
  ExpectBad(j, "units[0].params[1].numel");
  j["units"][0]["params"][1]["shape"] = {uint64_t{1} << 20, uint64_t{1} << 20};  // fits 64 bits, not the shards
  j["units"][0]["params"][1]["numel"] = uint64_t{1} << 40;
  ExpectBad(j, "the shards hold only");
  j = ValidJson();
  j["units"][0]["params"][1]["shape"] = {uint64_t{1} << 32, uint64_t{1} << 32, 2};  // product overflows
  ExpectBad(j, "units[0].params[1].shape[1]");
  j = ValidJson();
  j["units"][0]["params"][0]["numel"] = 11;  // not the product of [2, 5]
  ExpectBad(j, "units[0].params[0].numel");
  j = ValidJson();
  j["units"][0]["params"][1]["offset"] = 5;  // inside w
  ExpectBad(j, "units[0].params[1].offset");
  j = ValidJson();
  j["units"][0]["params"][1]["offset"] = UINT64_MAX;
  ExpectBad(j, "units[0].params[1].offset");
}

TEST(ParseManifest, ShardsCoverEveryRankExactlyOnceWithPlainNames) {
  json j = ValidJson();
  j["shards"][1]["rank"] = 1;  // ranks 1, 1
  ExpectBad(j, "shards[1].rank");
  j["shards"][1]["rank"] = 2;  // out of range for world 2
  ExpectBad(j, "shards[1].rank");
  j = ValidJson();
  j["shards"].erase(1);
  ExpectBad(j, "lists 1 shards for world size 2");
  for (const char* bad : {"../shard_00000.bin", "/etc/passwd", "sub/shard.bin", "..", ""}) {
    j = ValidJson();
    j["shards"][1]["file"] = bad;
    ExpectBad(j, "shards[1].file");
  }
  j = ValidJson();
  j["shards"][1]["file"] = j["shards"][0]["file"];
  ExpectBad(j, "shards[1].file");
  j = ValidJson();
  j["units"][0]["params"][1]["name"] = "w";
  ExpectBad(j, "units[0].params[1].name");
}

// A NUL in a shard's name cut the error message short (it is printed as a C string) and other control
// bytes reached the terminal raw: they are refused, the name shown escaped and the message whole.
TEST(ParseManifest, AShardNameWithAControlByteIsRefusedAndShownEscaped) {
  const struct {
    std::string name, escaped, detail;
  } cases[] = {{std::string("shard\0.bin", 10), "shard\\x00.bin", "0x00 at byte 5"},
               {"shard\x1b[2J.bin", "shard\\x1b[2J.bin", "0x1b at byte 5"},
               {"a\x7f", "a\\x7f", "0x7f at byte 1"},
               {"two\nlines", "two\\nlines", "0x0a at byte 3"}};
  for (const auto& c : cases) {
    json j = ValidJson();
    j["shards"][1]["file"] = c.name;
    const absl::Status s = Parse(j);
    ASSERT_FALSE(s.ok()) << c.escaped;
    const std::string msg(s.message());
    EXPECT_THAT(msg, HasSubstr("shards[1].file"));
    EXPECT_THAT(msg, HasSubstr("'" + c.escaped + "' is not a file inside the step directory: the file name holds a "
                               "control byte (" + c.detail + ")"));
    for (const char ch : msg) EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) << c.escaped;
  }
}

TEST(ParseManifest, DeepTrainerStateIsRefusedAndAllowedDepthKept) {
  json j = ValidJson();
  j.erase("trainer");
  std::string text = j.dump();
  text.pop_back();
  const std::string deep = text + ",\"trainer\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(ParseManifest(deep, "m.json").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(ParseManifest(deep, "m.json").status().message()), HasSubstr("deeper than"));
  const int allowed = kMaxJsonDepth - 1;
  const std::string nested = std::string(allowed, '[') + std::string(allowed, ']');
  auto m = ParseManifest(text + ",\"trainer\":" + nested + "}", "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->trainer_json, nested);
  EXPECT_TRUE(CheckTrainerState(nested).ok());
  EXPECT_FALSE(CheckTrainerState("[" + nested + "]").ok());
  EXPECT_FALSE(CheckTrainerState("{\"a\":").ok());
}

// Frozen parameters (format 2): the flag round-trips, is written only when set (a model without frozen
// parameters is the format-1 document), needs format 2, must be a bool, and a frozen parameter needs only
// its master bytes in the shards.
TEST(ParseManifest, FrozenParametersNeedFormat2AndOnlyTheirMasterBytes) {
  Manifest m = Valid();
  EXPECT_EQ(ToJson(m).find("frozen"), std::string::npos);
  m.version = kFrozenManifestVersion;
  m.units[0].params[0].frozen = true;
  auto parsed = ParseManifest(ToJson(m), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->units[0].params[0].frozen);
  EXPECT_FALSE(parsed->units[0].params[1].frozen);
  EXPECT_EQ(StateKinds("adamw", parsed->units[0].params[0]), std::vector<std::string>{"master"});
  EXPECT_EQ(StateKinds("adamw", parsed->units[0].params[1]).size(), 3u);
  json j = json::parse(ToJson(m));
  j["version"] = 1;
  ExpectBad(j, "units[0].params[0].frozen");
  j = json::parse(ToJson(m));
  j["units"][0]["params"][0]["frozen"] = 1;
  ExpectBad(j, "units[0].params[0].frozen");
  // 10 frozen elements x 4 bytes + 3 trainable x 12: 76 bytes of state; shards declaring less are refused.
  j = json::parse(ToJson(m));
  j["shards"][0]["bytes"] = 38;
  j["shards"][1]["bytes"] = 38;
  EXPECT_TRUE(Parse(j).ok()) << Parse(j);
  j["shards"][1]["bytes"] = 37;
  ExpectBad(j, "need 76 bytes");
}

// Skipped steps (format 3, Note [Parameters without a gradient]): written only when some parameter skipped a
// step, round-trip, need format 3 and a non-negative integer.
TEST(ParseManifest, SkippedStepsNeedFormat3) {
  Manifest m = Valid();
  EXPECT_EQ(ToJson(m).find("skipped_steps"), std::string::npos);
  m.version = kSkippedManifestVersion;
  m.units[0].params[1].skipped_steps = 4;
  auto parsed = ParseManifest(ToJson(m), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->units[0].params[0].skipped_steps, 0);
  EXPECT_EQ(parsed->units[0].params[1].skipped_steps, 4);
  json j = json::parse(ToJson(m));
  j["version"] = 2;
  ExpectBad(j, "units[0].params[1].skipped_steps");
  j = json::parse(ToJson(m));
  j["units"][0]["params"][1]["skipped_steps"] = -1;
  ExpectBad(j, "units[0].params[1].skipped_steps");
  j["units"][0]["params"][1]["skipped_steps"] = "4";
  ExpectBad(j, "units[0].params[1].skipped_steps");
}

// A param group's own lr and weight decay (format 4, Note [Param groups]): written only when set, round-trip
// exactly, need format 4, a finite number >= 0, and an own decay only on a parameter that decays.
TEST(ParseManifest, OwnLrAndWeightDecayNeedFormat4) {
  Manifest m = Valid();
  EXPECT_EQ(ToJson(m).find("own_"), std::string::npos);
  m.version = kOwnHyperManifestVersion;
  m.units[0].params[0].own_lr = 0.1 + 0.2;  // not a short decimal: the text must round-trip the bits
  m.units[0].params[0].own_weight_decay = 0.05;
  m.units[0].params[1].own_lr = 0.0;
  auto parsed = ParseManifest(ToJson(m), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->units[0].params[0].own_lr, 0.1 + 0.2);
  EXPECT_EQ(parsed->units[0].params[0].own_weight_decay, 0.05);
  EXPECT_EQ(parsed->units[0].params[1].own_lr, 0.0);
  EXPECT_FALSE(parsed->units[0].params[1].own_weight_decay.has_value());
  json j = json::parse(ToJson(m));
  j["version"] = 3;
  ExpectBad(j, "units[0].params[0].own_lr");
  for (const char* key : {"own_lr", "own_weight_decay"}) {
    j = json::parse(ToJson(m));
    j["units"][0]["params"][0][key] = -0.5;
    ExpectBad(j, std::string("units[0].params[0].") + key);
    j["units"][0]["params"][0][key] = "0.1";
    ExpectBad(j, std::string("units[0].params[0].") + key);
  }
  j = json::parse(ToJson(m));
  j["units"][0]["params"][1]["own_weight_decay"] = 0.1;  // b does not decay
  ExpectBad(j, "units[0].params[1].own_weight_decay");
}

TEST(ParseManifest, NewerVersionAndForeignDocuments) {
  json j = ValidJson();
  j["version"] = 9;
  EXPECT_EQ(Parse(j).code(), absl::StatusCode::kFailedPrecondition);
  for (const char* text : {"", "[]", "null", "{\"format\": 3}", "{\"format\": \"strata-checkpoint\"}", "\xff\xfe"}) {
    EXPECT_FALSE(ParseManifest(text, "m.json").ok()) << text;
  }
}

TEST(ParseManifest, EveryPrefixOfAValidManifestIsAnErrorNotACrash) {
  const std::string text = ToJson(Valid());
  for (size_t n = 0; n < text.size(); ++n) {
    EXPECT_FALSE(ParseManifest(text.substr(0, n), "m.json").ok()) << n;
  }
  EXPECT_TRUE(ParseManifest(text, "m.json").ok());
}

}  // namespace
}  // namespace strata::checkpoint
