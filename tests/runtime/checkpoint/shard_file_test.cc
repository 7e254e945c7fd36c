// Shard files: a failed or abandoned write leaves no temporary; a hostile header (deep, mistyped,
// overflowing, repeated or out-of-file ranges, oversized length) is a named error before any data is read; lanes of
// NVMe state lie in the file as their tiles, written or cloned to the same bytes (decision 0057).
#include "runtime/checkpoint/shard_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/crc32.h"
#include "tests/offload/offload_test_util.h"
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

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Note [NVMe lanes laid out as tiles]: a packed range, then two lanes (a unit's master and exp_avg over its
// update range [1000, 4000)), each with padding before, between and after its ranges.
struct Lanes {
  std::vector<ShardRange> ranges = {{"p", "x", "master", 0, 5},
                                    {"u", "w", "master", 1010, 1500},
                                    {"u", "b", "master", 2600, 7},
                                    {"u", "w", "exp_avg", 1010, 1500},
                                    {"u", "b", "exp_avg", 2600, 7}};
  std::vector<ShardLane> lanes = {{1, 3, 1000, 3000}, {3, 5, 1000, 3000}};
  std::vector<float> packed = {1, 2, 3, 4, 5};
  std::vector<std::vector<float>> lane_data;  // every element, the padding too (as the tiles hold it)
  Lanes() {
    for (int l = 0; l < 2; ++l) {
      std::vector<float>& d = lane_data.emplace_back(3000);
      for (size_t i = 0; i < d.size(); ++i) d[i] = 0.25f * static_cast<float>(i) + 1000.0f * static_cast<float>(l + 1);
    }
  }
};

TEST_F(ShardFile, LanesLieInTheFileAsTheirTiles) {
  const Lanes t;
  auto w = ShardWriter::Create(Path("lanes.bin"), 0, 1, t.ranges, t.lanes);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->WriteLane(1, t.lane_data[1].data(), 3000).ok());  // lanes in any order
  ASSERT_TRUE(w->Write(0, t.packed.data()).ok());
  ASSERT_TRUE(w->WriteLane(0, t.lane_data[0].data(), 7).ok());  // a lane in pieces
  ASSERT_TRUE(w->WriteLane(0, t.lane_data[0].data() + 7, 2993).ok());
  auto done = w->Finish();
  ASSERT_TRUE(done.ok()) << done.status();
  auto r = ShardReader::Open(dir_.string(), "lanes.bin");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string bytes = ReadAll(Path("lanes.bin"));
  EXPECT_EQ(bytes.size(), done->second);
  const std::vector<ShardRange>& got = r->ranges();
  ASSERT_EQ(got.size(), 5u);
  const uint64_t packed_end = got[0].offset + 20;
  for (int l = 0; l < 2; ++l) {
    const ShardRange& w_range = got[1 + 2 * l];
    const uint64_t at = w_range.offset - 10 * 4;  // the lane's start: w begins 10 elements in
    EXPECT_EQ(at % 4096, 0u);
    EXPECT_EQ(got[2 + 2 * l].offset, at + 1600 * 4);
    // The lane's every byte, the padding between ranges too, then zeros to its last block's end.
    ASSERT_LE(at + 12288, bytes.size());  // 12000 bytes in 3 blocks
    EXPECT_EQ(std::memcmp(bytes.data() + at, t.lane_data[l].data(), 12000), 0) << "lane " << l;
    EXPECT_TRUE(bytes.substr(at + 12000, 288) == std::string(288, '\0')) << "lane " << l;
    for (int k = 0; k < 2; ++k) {  // the ranges read back, CRCs checked
      std::vector<float> v;
      ASSERT_TRUE(r->Read(got[1 + 2 * l + k], &v).ok());
      const uint64_t from = got[1 + 2 * l + k].begin - 1000;
      EXPECT_EQ(v, std::vector<float>(t.lane_data[l].begin() + from, t.lane_data[l].begin() + from + v.size()));
    }
  }
  const uint64_t first_lane = got[1].offset - 40;
  EXPECT_TRUE(bytes.substr(packed_end, first_lane - packed_end) == std::string(first_lane - packed_end, '\0'));
  EXPECT_EQ(got[3].offset - 40, first_lane + 12288) << "the second lane follows the first one's last block";
  EXPECT_EQ(bytes.size(), got[3].offset - 40 + 12288) << "the file ends with the last lane's last block";
}

TEST_F(ShardFile, LaneMisuseIsRefused) {
  const Lanes t;
  {
    auto w = ShardWriter::Create(Path("a.bin"), 0, 1, t.ranges, t.lanes);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->Write(1, t.lane_data[0].data()).code(), absl::StatusCode::kInvalidArgument) << "a lane's range";
    EXPECT_EQ(w->WriteLane(2, t.lane_data[0].data(), 1).code(), absl::StatusCode::kOutOfRange);
    ASSERT_TRUE(w->Write(0, t.packed.data()).ok());
    ASSERT_TRUE(w->WriteLane(0, t.lane_data[0].data(), 3000).ok());
    EXPECT_EQ(w->WriteLane(0, t.lane_data[0].data(), 1).code(), absl::StatusCode::kOutOfRange) << "past its end";
    ASSERT_TRUE(w->WriteLane(1, t.lane_data[1].data(), 2999).ok());
    const auto unfinished = w->Finish();
    EXPECT_FALSE(unfinished.ok()) << "a lane one element short was published";
  }
  EXPECT_THAT(Temps(dir_), IsEmpty());
  std::vector<ShardLane> overlapping = {{1, 3, 1000, 3000}, {2, 5, 1000, 3000}};
  EXPECT_EQ(ShardWriter::Create(Path("b.bin"), 0, 1, t.ranges, overlapping).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<ShardLane> short_lane = {{1, 3, 1000, 1600}, {3, 5, 1000, 3000}};  // b lies past its end
  EXPECT_EQ(ShardWriter::Create(Path("c.bin"), 0, 1, t.ranges, short_lane).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<ShardRange> unordered = t.ranges;
  std::swap(unordered[1], unordered[2]);
  EXPECT_EQ(ShardWriter::Create(Path("d.bin"), 0, 1, unordered, t.lanes).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Note [Cloned checkpoint lanes]: a lane cloned tile by tile (tiles of 1024 elements) from a file that holds it as
// the tiles do gives the file WriteLane gives, byte for byte, its ranges' CRCs spliced from the tiles' CRCs (`crcs`,
// per lane and tile: the store's, as given) and the pieces read back; on XFS its whole blocks are then shared with
// the source. Where the file systems cannot clone (this directory and another file system, or a file system without
// clones), CloneTile is Unimplemented and changed nothing: the lane is then written whole. Returns the bytes read back.
uint64_t CloneLanes(const Lanes& t, const std::string& src_dir, const std::string& path, bool expect_clone,
                    const std::vector<std::vector<uint32_t>>& crcs) {
  const std::string src = src_dir + "/tiles";
  {
    std::string tiles(2 * 16384, '\0');  // each lane's bytes at a block, as tiles of 1024 elements hold them
    for (int l = 0; l < 2; ++l) std::memcpy(tiles.data() + l * 16384, t.lane_data[l].data(), 12000);
    std::ofstream(src, std::ios::binary) << tiles;
  }
  const int fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  auto w = ShardWriter::Create(path, 0, 1, t.ranges, t.lanes);
  EXPECT_TRUE(w.ok()) << w.status();
  const bool direct = w->direct();
  EXPECT_TRUE(w->Write(0, t.packed.data()).ok());
  for (int l = 0; l < 2; ++l) {
    // 12000 bytes: two tiles of one whole block each, then a tile of 3808 bytes, less than a block.
    for (int b = 0; b < 3; ++b) {
      const uint64_t bytes = b < 2 ? 4096 : 3808;
      const std::vector<ShardWriter::CloneSource> from = {{fd, src, uint64_t(l * 16384 + b * 4096), 4096}};
      auto cloned = w->CloneTile(l, from, bytes, crcs[l][b]);
      if (!expect_clone && absl::IsUnimplemented(cloned.status())) break;
      EXPECT_TRUE(cloned.ok()) << cloned.status();
      if (!cloned.ok()) break;
      EXPECT_EQ(cloned->bytes, bytes);
      auto read = w->ClonedCrc(*cloned);
      EXPECT_TRUE(read.ok() && *read == Crc32(t.lane_data[l].data() + b * 1024, bytes))
          << "lane " << l << " tile " << b;
    }
    const std::vector<ShardWriter::CloneSource> again = {{fd, src, 0, 4096}};
    EXPECT_EQ(w->CloneTile(l, again, 4096, 0).status().code(),
              expect_clone ? absl::StatusCode::kOutOfRange : absl::StatusCode::kUnimplemented)
        << "past the lane's end";
    const uint64_t done = w->lane_done(l);
    EXPECT_EQ(done, expect_clone ? 3000u : 0u);
    if (done < 3000) {
      EXPECT_TRUE(w->WriteLane(l, t.lane_data[l].data() + done, 3000 - done).ok());
    }
  }
  ::close(fd);
  EXPECT_EQ(w->direct(), direct) << "the clones, or a refused one, turned the file's writes buffered";
  const uint64_t read_back = w->read_back_bytes();
  EXPECT_TRUE(w->Finish().ok());
  return read_back;
}

// The store's CRC of each tile of the two lanes.
std::vector<std::vector<uint32_t>> TileCrcs(const Lanes& t) {
  std::vector<std::vector<uint32_t>> crcs(2);
  for (int l = 0; l < 2; ++l) {
    for (int b = 0; b < 3; ++b) crcs[l].push_back(Crc32(t.lane_data[l].data() + b * 1024, b < 2 ? 4096 : 3808));
  }
  return crcs;
}

// Whether `dir`'s file system clones (FICLONE of one block between two files in it).
bool ClonesIn(const std::string& dir) {
  const std::string a = dir + "/probe.a", b = dir + "/probe.b";
  std::ofstream(a, std::ios::binary) << std::string(4096, 'x');
  const int src = ::open(a.c_str(), O_RDONLY | O_CLOEXEC),
            dst = ::open(b.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  const bool ok = src >= 0 && dst >= 0 && ::ioctl(dst, FICLONE, src) == 0;
  ::close(src);
  ::close(dst);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
  return ok;
}

TEST_F(ShardFile, ClonedLanesAreTheWrittenLanes) {
  const Lanes t;
  const std::vector<std::vector<uint32_t>> crcs = TileCrcs(t);
  {
    auto w = ShardWriter::Create(Path("written.bin"), 0, 1, t.ranges, t.lanes);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write(0, t.packed.data()).ok());
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(w->WriteLane(l, t.lane_data[l].data(), 3000).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  const std::string written = ReadAll(Path("written.bin"));
  // Where the tests' scratch lives (ext4 or tmpfs: refused, then written; or a file system that clones).
  CloneLanes(t, dir_.string(), Path("scratch.bin"), ClonesIn(dir_.string()), crcs);
  EXPECT_TRUE(ReadAll(Path("scratch.bin")) == written);
  offload::testing::XfsMount xfs;
  if (!xfs.ok()) {
    if (offload::testing::XfsMount::RequireXfs()) FAIL() << xfs.reason();
    GTEST_SKIP() << xfs.reason();
  }
  const uint64_t read_back = CloneLanes(t, xfs.path(), xfs.path() + "/cloned.bin", /*expect_clone=*/true, crcs);
  EXPECT_TRUE(ReadAll(xfs.path() + "/cloned.bin") == written);
  EXPECT_EQ(offload::testing::SharedBytes(xfs.path() + "/cloned.bin"), 4u * 4096) << "the clones share 4 blocks";
  // The pieces read back for the CRCs: per lane, the padding before w in tile 0 (one block) and tile 1 but for w's
  // part (one block), then each tile whole for ClonedCrc: 2 + 3 blocks; the 3808-byte tile is read from memory.
  EXPECT_EQ(read_back, 2u * (2 + 2) * 4096) << "the CRCs were not spliced from the tiles'";
  auto r = ShardReader::Open(xfs.path(), "cloned.bin");
  ASSERT_TRUE(r.ok()) << r.status();
  for (const ShardRange& range : r->ranges()) {
    std::vector<float> v;
    EXPECT_TRUE(r->Read(range, &v).ok()) << range.param << " " << range.kind;
  }
  // The ranges' CRCs are the store's word for the tiles: a tile whose CRC is not its bytes' (a corrupt tile, seen
  // from the clone's side) gives a range that fails its check, and ClonedCrc tells them apart.
  std::vector<std::vector<uint32_t>> wrong = crcs;
  wrong[1][0] ^= 1;
  CloneLanes(t, xfs.path(), xfs.path() + "/wrong.bin", /*expect_clone=*/true, wrong);
  auto bad = ShardReader::Open(xfs.path(), "wrong.bin");
  ASSERT_TRUE(bad.ok()) << bad.status();
  for (const ShardRange& range : bad->ranges()) {
    std::vector<float> v;
    const bool in_tile = range.kind == "exp_avg" && range.param == "w";
    EXPECT_EQ(bad->Read(range, &v).code(), in_tile ? absl::StatusCode::kDataLoss : absl::StatusCode::kOk)
        << range.param << " " << range.kind;
  }
  // Across file systems (EXDEV): refused, nothing changed, then written.
  CloneLanes(t, dir_.string(), xfs.path() + "/across.bin", /*expect_clone=*/false, crcs);
  EXPECT_TRUE(ReadAll(xfs.path() + "/across.bin") == written);
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
