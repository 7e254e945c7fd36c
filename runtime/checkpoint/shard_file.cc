#include "runtime/checkpoint/shard_file.h"

#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/crc32.h"
#include "runtime/base/status.h"

namespace strata::checkpoint {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'H'};
constexpr uint64_t kAlign = 4096;

std::string HeaderJson(int rank, int world, const std::vector<ShardRange>& ranges) {
  nlohmann::ordered_json j;
  j["rank"] = rank;
  j["world_size"] = world;
  auto arr = nlohmann::ordered_json::array();
  for (const ShardRange& r : ranges) {
    // Fixed-width CRC text keeps the header length independent of the CRC values.
    arr.push_back({{"unit", r.unit}, {"param", r.param}, {"kind", r.kind}, {"begin", r.begin},
                   {"count", r.count}, {"offset", r.offset}, {"crc32", absl::StrFormat("%08x", r.crc)}});
  }
  j["ranges"] = arr;
  return j.dump();
}

std::string Label(const ShardRange& r) { return absl::StrCat(r.unit, ".", r.param, " ", r.kind); }

}  // namespace

absl::StatusOr<ShardWriter> ShardWriter::Create(const std::string& path, int rank, int world_size,
                                                std::vector<ShardRange> ranges) {
  ShardWriter w;
  w.path_ = path;
  w.tmp_ = absl::StrCat(path, ".tmp.", ::getpid());
  w.rank_ = rank;
  w.world_ = world_size;
  // The offsets' digits change the header's length: lay out with a generous guess, then with the data
  // start that fits the header of those offsets (offsets only grow, so one more pass always fits).
  uint64_t data_start = kAlign, offset = 0;
  for (int pass = 0; pass < 3; ++pass) {
    offset = data_start;
    for (ShardRange& r : ranges) {
      r.offset = offset;
      offset += r.count * 4;
    }
    const uint64_t need = (16 + HeaderJson(rank, world_size, ranges).size() + kAlign - 1) / kAlign * kAlign;
    if (need <= data_start) break;
    data_start = need;
  }
  w.header_bytes_ = data_start;
  w.end_ = offset;
  if (HeaderJson(rank, world_size, ranges).size() + 16 > data_start) {
    return absl::InternalError("shard header outgrew its reserved space");
  }
  w.ranges_ = std::move(ranges);
  w.written_.assign(w.ranges_.size(), false);
  STRATA_ASSIGN_OR_RETURN(w.fd_, OpenForWrite(w.tmp_));
  return w;
}

absl::Status ShardWriter::Write(size_t index, const float* data) {
  ShardRange& r = ranges_[index];
  r.crc = Crc32(data, r.count * 4);
  written_[index] = true;
  return WriteAt(fd_.get(), data, r.count * 4, r.offset, tmp_);
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> ShardWriter::Finish() {
  for (size_t i = 0; i < ranges_.size(); ++i) {
    if (!written_[i]) return absl::InternalError(absl::StrCat("shard range ", Label(ranges_[i]), " never written"));
  }
  const std::string header = HeaderJson(rank_, world_, ranges_);
  std::string prefix(kMagic, 8);
  const uint64_t len = header.size();
  prefix.append(reinterpret_cast<const char*>(&len), 8);
  prefix += header;
  prefix.resize(header_bytes_, ' ');
  STRATA_RETURN_IF_ERROR(WriteAt(fd_.get(), prefix.data(), prefix.size(), 0, tmp_));
  STRATA_RETURN_IF_ERROR(Fsync(fd_.get(), tmp_));
  fd_ = Fd();
  STRATA_RETURN_IF_ERROR(RenameDurably(tmp_, path_));
  return std::make_pair(Crc32(header.data(), header.size()), end_);
}

absl::StatusOr<ShardReader> ShardReader::Open(const std::string& path, const uint32_t* expected_checksum,
                                              const uint64_t* expected_size) {
  ShardReader r;
  r.path_ = path;
  auto fd = OpenForRead(path);
  if (!fd.ok()) {
    return absl::NotFoundError(absl::StrCat("checkpoint shard '", path, "' is missing or unreadable: ",
                                            fd.status().message()));
  }
  r.fd_ = std::move(*fd);
  STRATA_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
  if (expected_size != nullptr && size != *expected_size) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "' has ", size, " bytes; the manifest says ",
                                            *expected_size, " (truncated or replaced)"));
  }
  char head[16];
  STRATA_RETURN_IF_ERROR(ReadAt(r.fd_.get(), head, 16, 0, path));
  uint64_t len = 0;
  std::memcpy(&len, head + 8, 8);
  if (std::memcmp(head, kMagic, 8) != 0 || len > size) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a strata checkpoint shard (bad magic or header)"));
  }
  std::string header(len, '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(r.fd_.get(), header.data(), len, 16, path));
  if (expected_checksum != nullptr && Crc32(header.data(), header.size()) != *expected_checksum) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': header checksum differs from the manifest"));
  }
  auto j = nlohmann::json::parse(header, nullptr, false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': corrupt header"));
  try {
    r.rank_ = j.at("rank").get<int>();
    r.world_ = j.at("world_size").get<int>();
    for (const auto& e : j.at("ranges")) {
      ShardRange s{e.at("unit").get<std::string>(), e.at("param").get<std::string>(), e.at("kind").get<std::string>(),
                   e.at("begin").get<uint64_t>(), e.at("count").get<uint64_t>(), e.at("offset").get<uint64_t>(), 0};
      s.crc = static_cast<uint32_t>(std::stoul(e.at("crc32").get<std::string>(), nullptr, 16));
      if (s.offset + s.count * 4 > size) {
        return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': range ", Label(s),
                                                " extends past the end of the file (truncated?)"));
      }
      r.ranges_.push_back(std::move(s));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': malformed header: ", e.what()));
  }
  return r;
}

const ShardRange* ShardReader::Find(const std::string& unit, const std::string& param, const std::string& kind) const {
  for (const ShardRange& s : ranges_) {
    if (s.unit == unit && s.param == param && s.kind == kind) return &s;
  }
  return nullptr;
}

absl::Status ShardReader::Read(const ShardRange& r, std::vector<float>* out) const {
  out->resize(r.count);
  STRATA_RETURN_IF_ERROR(ReadAt(fd_.get(), out->data(), r.count * 4, r.offset, path_));
  if (Crc32(out->data(), r.count * 4) != r.crc) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path_, "': range ", Label(r), " [", r.begin, ", ",
                                            r.begin + r.count, ") fails its checksum (corrupted bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace strata::checkpoint
