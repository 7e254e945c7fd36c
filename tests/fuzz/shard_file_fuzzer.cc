// Fuzzes the checkpoint shard-file reader (runtime/checkpoint/shard_file.cc): "STRATASH", a u64 header
// length, a JSON header of ranges, then fp32 data, from an untrusted checkpoint. The input is the whole
// file. Properties beyond "no crash, leak or UB":
//  - a rejection is DataLoss naming the file;
//  - every accepted range lies inside the file (offset + 4 * count <= size, without wrapping), so that
//    reading it never allocates more than the file holds;
//  - every accepted number is the header's number exactly (json_exact.h), each CRC-32 its hex text's value;
//  - reading each accepted range either succeeds or is DataLoss (checksum) naming the file.
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/status/status.h"
#include "runtime/checkpoint/shard_file.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/json_exact.h"

namespace {

void ExpectDataLoss(const absl::Status& s, const std::string& path) {
  STRATA_FUZZ_EXPECT(s.code() == absl::StatusCode::kDataLoss, "unexpected error kind: %s", s.ToString().c_str());
  STRATA_FUZZ_EXPECT(s.message().find(path) != absl::string_view::npos, "error does not name the file: %s",
                     s.ToString().c_str());
}

// Open accepted the file, so it holds 16 + header length bytes and the header parses.
void ExpectExactNumbers(const uint8_t* data, const strata::checkpoint::ShardReader& r) {
  uint64_t len = 0;
  std::memcpy(&len, data + 8, 8);
  const auto j = nlohmann::json::parse(data + 16, data + 16 + len);
  strata::fuzz::ExpectExact(j, "rank", r.rank(), "header");
  strata::fuzz::ExpectExact(j, "world_size", r.world_size(), "header");
  size_t i = 0;
  for (const auto& e : j.at("ranges")) {
    const auto& range = r.ranges().at(i);
    const std::string what = "ranges[" + std::to_string(i++) + "]";
    strata::fuzz::ExpectExact(e, "begin", range.begin, what);
    strata::fuzz::ExpectExact(e, "count", range.count, what);
    strata::fuzz::ExpectExact(e, "offset", range.offset, what);
    strata::fuzz::ExpectExactHex32(e, "crc32", range.crc, what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::DirFile* const file = new strata::fuzz::DirFile("shard_00000.bin");
  file->Set(data, size);
  auto reader = strata::checkpoint::ShardReader::Open(file->dir(), file->name());
  if (!reader.ok()) {
    ExpectDataLoss(reader.status(), file->name());
    return 0;
  }
  ExpectExactNumbers(data, *reader);
  for (const strata::checkpoint::ShardRange& r : reader->ranges()) {
    const bool inside = r.offset <= size && r.count <= (size - r.offset) / 4;
    STRATA_FUZZ_EXPECT(inside, "accepted range %s.%s %s: offset %llu + 4 x %llu elements is past the %zu-byte file",
                       r.unit.c_str(), r.param.c_str(), r.kind.c_str(), static_cast<unsigned long long>(r.offset),
                       static_cast<unsigned long long>(r.count), size);
  }
  for (const strata::checkpoint::ShardRange& r : reader->ranges()) {
    STRATA_FUZZ_EXPECT(reader->Find(r.unit, r.param, r.kind) != nullptr, "Find misses an accepted range");
    std::vector<float> values;
    const absl::Status s = reader->Read(r, &values);
    if (!s.ok()) {
      ExpectDataLoss(s, file->name());
      continue;
    }
    STRATA_FUZZ_EXPECT(values.size() == r.count, "Read returned %zu values for a %llu-element range", values.size(),
                       static_cast<unsigned long long>(r.count));
  }
  return 0;
}
