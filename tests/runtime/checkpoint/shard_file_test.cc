// Shard files: a failed or abandoned write leaves no temporary; a hostile header (deep, mistyped,
// overflowing, repeated or out-of-file ranges, oversized length) is a named error before any data is read.
#include "runtime/checkpoint/shard_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/checkpoint/test_dir.h"
#include "tests/runtime/checkpoint/tiny_checkpoint.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using nlohmann::json;
using ShardFile = testing::TestDir;

// A file with the shard magic, `header` as its header, and `data_bytes` zero bytes after it.
void WriteRaw(const std::string& path, const std::string& header, uint64_t len, size_t data_bytes) {
  std::string bytes("STRATASH", 8);
  bytes.append(reinterpret_cast<const char*>(&len), 8);
  bytes += header;
  bytes.resize(bytes.size() + data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

json Header(json range) { return {{"rank", 0}, {"world_size", 1}, {"ranges", json::array({range})}}; }

json GoodRange() {
  return {{"unit", "u"}, {"param", "w"}, {"kind", "master"}, {"begin", 0}, {"count", 4}, {"offset", 1024},
          {"crc32", "00000000"}};
}

absl::Status OpenHeader(const std::string& dir, const json& header) {
  const std::string text = header.dump();
  WriteRaw(dir + "/s.bin", text, text.size(), 2048);
  return ShardReader::Open(dir, "s.bin").status();
}

TEST_F(ShardFile, WritesAndReadsBack) {
  Manifest m = testing::WriteTinyCheckpoint(dir_.string());
  auto r = ShardReader::Open(dir_.string(), "shard_00001.bin", &m.shards[1].checksum, &m.shards[1].bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 1);
  const ShardRange* b = r->Find("u", "b", "exp_avg");
  ASSERT_NE(b, nullptr);
  std::vector<float> v;
  ASSERT_TRUE(r->Read(*b, &v).ok());
  EXPECT_EQ(v, (std::vector<float>{112, 113, 114}));
  EXPECT_THAT(Temps(dir_), IsEmpty());
}

TEST_F(ShardFile, FailedOrAbandonedWriteLeavesNoTemporary) {
  const std::vector<ShardRange> ranges = {{"u", "w", "master", 0, 4}};
  const std::vector<float> data(4, 1.0f);
  {  // abandoned before Finish (an error in the caller)
    auto w = ShardWriter::Create(Path("a.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write(0, data.data()).ok());
    EXPECT_THAT(Temps(dir_), ::testing::SizeIs(1));
  }
  EXPECT_THAT(Temps(dir_), IsEmpty());
  {  // the rename fails: the target is a non-empty directory
    Write("b.bin/inside", "x");
    auto w = ShardWriter::Create(Path("b.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write(0, data.data()).ok());
    EXPECT_FALSE(w->Finish().ok());
  }
  EXPECT_THAT(Temps(dir_), IsEmpty());
  {  // a range never written
    auto w = ShardWriter::Create(Path("c.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE(w->Finish().ok());
    EXPECT_FALSE(w->Write(7, data.data()).ok());
  }
  EXPECT_THAT(Temps(dir_), IsEmpty());
}

// WritePart (Note [Snapshots of NVMe state]: a lane streamed in pieces): a range written in pieces, in order,
// gives the file of one Write per range, byte for byte; a piece past the range's end is refused.
TEST_F(ShardFile, ARangeWrittenInPiecesIsTheSameFile) {
  const std::vector<ShardRange> ranges = {{"u", "w", "master", 0, 10}, {"u", "b", "master", 10, 3}};
  std::vector<float> data(13);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i) - 2;
  {
    auto w = ShardWriter::Create(Path("whole.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write(1, data.data() + 10).ok());
    ASSERT_TRUE(w->Write(0, data.data()).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  {
    auto w = ShardWriter::Create(Path("parts.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->WritePart(0, data.data(), 4).ok());
    ASSERT_TRUE(w->WritePart(1, data.data() + 10, 3).ok());
    ASSERT_TRUE(w->WritePart(0, data.data() + 4, 0).ok());
    ASSERT_TRUE(w->WritePart(0, data.data() + 4, 5).ok());
    EXPECT_FALSE(w->Finish().ok()) << "a range with a piece missing was published";
  }
  {
    auto w = ShardWriter::Create(Path("parts.bin"), 0, 1, ranges);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->WritePart(0, data.data(), 4).ok());
    ASSERT_TRUE(w->WritePart(1, data.data() + 10, 3).ok());
    ASSERT_TRUE(w->WritePart(0, data.data() + 4, 6).ok());
    const absl::Status past = w->WritePart(0, data.data(), 1);
    EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
    ASSERT_TRUE(w->Finish().ok());
  }
  std::ifstream a(Path("whole.bin"), std::ios::binary), b(Path("parts.bin"), std::ios::binary);
  const std::string whole(std::istreambuf_iterator<char>(a), {}), parts(std::istreambuf_iterator<char>(b), {});
  EXPECT_FALSE(whole.empty());
  EXPECT_TRUE(whole == parts);
}

TEST_F(ShardFile, GoodHandMadeHeaderOpens) { EXPECT_TRUE(OpenHeader(dir_.string(), Header(GoodRange())).ok()); }

TEST_F(ShardFile, HostileHeadersAreNamedErrors) {
  const std::string d = dir_.string();
  auto expect_bad = [&](const json& header, const std::string& text) {
    absl::Status s = OpenHeader(d, header);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << header.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr("s.bin")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << s;
  };
  json r = GoodRange();
  r["count"] = "4";
  expect_bad(Header(r), "ranges[0].count");
  r = GoodRange();
  r["count"] = uint64_t{1} << 62;  // count * 4 overflows
  expect_bad(Header(r), "extends past the end");
  r = GoodRange();
  r["offset"] = UINT64_MAX - 3;
  expect_bad(Header(r), "extends past the end");
  r = GoodRange();
  r["begin"] = UINT64_MAX;
  expect_bad(Header(r), "ranges[0].count");
  r = GoodRange();
  r["offset"] = 0;
  expect_bad(Header(r), "points into the header");
  r = GoodRange();
  r["kind"] = "mystery";
  expect_bad(Header(r), "ranges[0].kind");
  r = GoodRange();
  r["crc32"] = "12";
  expect_bad(Header(r), "ranges[0].crc32");
  json h = Header(GoodRange());
  h["ranges"].push_back(GoodRange());
  expect_bad(h, "repeats range");
  h = Header(GoodRange());
  h["rank"] = 1;  // of world size 1
  expect_bad(h, "'rank'");
  h = Header(GoodRange());
  h["ranges"] = "none";
  expect_bad(h, "'ranges'");
  h = Header(GoodRange());
  h["deep"] = json::parse(std::string(100, '[') + std::string(100, ']'));
  expect_bad(h, "deeper than");
  expect_bad(json::array(), "object");
}

TEST(ParseShardHeader, EveryPrefixOfAValidHeaderIsAnErrorNotACrash) {
  json h = Header(GoodRange());
  h["ranges"].push_back(GoodRange());
  h["ranges"][1]["kind"] = "exp_avg";
  const std::string text = h.dump();
  auto ok = ParseShardHeader(text, 2048, "s.bin");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->ranges.size(), 2u);
  EXPECT_EQ(ok->ranges[1].kind, "exp_avg");
  EXPECT_FALSE(ParseShardHeader(text, 1024, "s.bin").ok()) << "ranges past a shorter file";
  for (size_t n = 0; n < text.size(); ++n) EXPECT_FALSE(ParseShardHeader(text.substr(0, n), 2048, "s.bin").ok()) << n;
}

TEST_F(ShardFile, HeaderLengthIsBounded) {
  const std::string header = Header(GoodRange()).dump();
  WriteRaw(Path("s.bin"), header, uint64_t{1} << 60, 2048);
  EXPECT_THAT(std::string(ShardReader::Open(dir_.string(), "s.bin").status().message()),
              HasSubstr("bad magic or header"));
  std::ofstream(Path("short.bin")) << "STRATA";
  EXPECT_EQ(ShardReader::Open(dir_.string(), "short.bin").status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(ShardFile, OpenStaysInsideItsDirectory) {
  testing::WriteTinyCheckpoint(Path("step"));
  fs::rename(Path("step/shard_00001.bin"), Path("outside.bin"));
  fs::create_symlink("../outside.bin", Path("step/shard_00001.bin"));
  for (const std::string& name : {std::string("shard_00001.bin"), std::string("../outside.bin"), Path("outside.bin")}) {
    auto r = ShardReader::Open(Path("step"), name);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << name;
  }
}

}  // namespace
}  // namespace strata::checkpoint
