#include "runtime/checkpoint/shard_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/crc32.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/json_input.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/optim/state_kind.h"

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

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

constexpr char kZeros[kAlign] = {};
constexpr size_t kReadBackBytes = size_t{4} << 20;  // a clone is read back in pieces of this size

}  // namespace

absl::StatusOr<ShardWriter> ShardWriter::Create(const std::string& path, int rank, int world_size,
                                                std::vector<ShardRange> ranges, std::vector<ShardLane> lanes) {
  STRATA_RETURN_IF_ERROR(CheckReplaceable(path));
  ShardWriter w;
  w.lane_of_.assign(ranges.size(), -1);
  for (size_t l = 0; l < lanes.size(); ++l) {  // Note [NVMe lanes laid out as tiles]
    const ShardLane& lane = lanes[l];
    if (lane.first >= lane.end || lane.end > ranges.size() || (l > 0 && lane.first < lanes[l - 1].end)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": shard lane #", l, " has no ranges or overlaps another"));
    }
    uint64_t next = lane.begin;
    for (size_t i = lane.first; i < lane.end; ++i) {
      const ShardRange& r = ranges[i];
      if (r.begin < next || r.begin > lane.begin + lane.elems || r.count > lane.begin + lane.elems - r.begin) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": shard range ", Label(r),
                                                       " is out of order in, or outside, its lane of ", lane.elems,
                                                       " elements from ", lane.begin));
      }
      next = r.begin + r.count;
      w.lane_of_[i] = static_cast<int>(l);
    }
  }
  w.path_ = path;
  w.tmp_ = TempFile(TempName(path));
  w.rank_ = rank;
  w.world_ = world_size;
  w.lane_at_.assign(lanes.size(), 0);
  w.lane_pad_from_.assign(lanes.size(), 0);
  // The offsets' digits change the header's length: lay out with a generous guess, then with the data
  // start that fits the header of those offsets (offsets only grow, so one more pass always fits).
  uint64_t data_start = kAlign, offset = 0;
  for (int pass = 0; pass < 3; ++pass) {
    offset = data_start;
    for (size_t i = 0; i < ranges.size();) {
      if (w.lane_of_[i] < 0) {
        ranges[i].offset = offset;
        offset += ranges[i].count * 4;
        ++i;
        continue;
      }
      const size_t l = static_cast<size_t>(w.lane_of_[i]);
      const ShardLane& lane = lanes[l];
      w.lane_pad_from_[l] = offset;
      offset = RoundUp(offset);
      w.lane_at_[l] = offset;
      for (size_t j = lane.first; j < lane.end; ++j) ranges[j].offset = offset + (ranges[j].begin - lane.begin) * 4;
      offset += RoundUp(lane.elems * 4);
      i = lane.end;
    }
    const uint64_t need = RoundUp(16 + HeaderJson(rank, world_size, ranges).size());
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
  w.part_.assign(w.ranges_.size(), 0);
  w.lane_done_.assign(lanes.size(), 0);
  w.lane_started_.assign(lanes.size(), false);
  w.lane_next_.resize(lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) w.lane_next_[l] = lanes[l].first;
  w.lanes_ = std::move(lanes);
  STRATA_ASSIGN_OR_RETURN(w.file_, StreamFile::Create(w.tmp_.path(), data_start));
  return w;
}

absl::Status ShardWriter::Write(size_t index, const float* data) {
  if (index >= ranges_.size()) return absl::OutOfRangeError(absl::StrCat("shard range #", index, " does not exist"));
  return WritePart(index, data, ranges_[index].count);
}

absl::Status ShardWriter::WritePart(size_t index, const float* data, uint64_t n) {
  if (index >= ranges_.size()) return absl::OutOfRangeError(absl::StrCat("shard range #", index, " does not exist"));
  ShardRange& r = ranges_[index];
  if (lane_of_[index] >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard range ", Label(r), " lies in a lane: WriteLane writes it"));
  }
  const uint64_t done = part_[index];
  if (written_[index] || n > r.count - done) {
    return absl::OutOfRangeError(
        absl::StrCat("shard range ", Label(r), ": writing ", n, " floats after ", done, " of ", r.count));
  }
  r.crc = Crc32(data, n * 4, done == 0 ? 0 : r.crc);  // crc32.h: incremental
  part_[index] = done + n;
  written_[index] = part_[index] == r.count;
  return file_.Write(data, n * 4, r.offset + done * 4);
}

void ShardWriter::Free::operator()(char* p) const { std::free(p); }

absl::Status ShardWriter::StartLane(size_t lane) {
  if (lane >= lanes_.size()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": shard lane #", lane, " does not exist"));
  }
  if (lane_started_[lane]) return absl::OkStatus();
  lane_started_[lane] = true;
  const uint64_t gap = lane_at_[lane] - lane_pad_from_[lane];  // less than a block
  return gap > 0 ? file_.Write(kZeros, gap, lane_pad_from_[lane]) : absl::OkStatus();
}

std::vector<ShardWriter::Piece> ShardWriter::PiecesOf(size_t lane, uint64_t from, uint64_t to) const {
  const ShardLane& l = lanes_[lane];
  std::vector<Piece> pieces;
  uint64_t at = from;
  for (size_t i = lane_next_[lane]; i < l.end; ++i) {
    const ShardRange& r = ranges_[i];
    const uint64_t b = r.begin - l.begin + part_[i], e = r.begin - l.begin + r.count;  // its elements not yet seen
    if (b >= to) break;
    if (b > at) pieces.push_back({at, b, -1});
    pieces.push_back({b, std::min(e, to), static_cast<int>(i)});
    at = std::min(e, to);
  }
  if (at < to) pieces.push_back({at, to, -1});
  return pieces;
}

void ShardWriter::Advance(size_t lane, const Piece& p, uint32_t crc) {
  ranges_[p.range].crc = crc;
  part_[p.range] += p.e - p.b;
  if (part_[p.range] == ranges_[p.range].count) {
    written_[p.range] = true;
    lane_next_[lane] = p.range + 1;
  }
}

void ShardWriter::Account(size_t lane, const float* data, uint64_t n) {
  const uint64_t from = lane_done_[lane];
  for (const Piece& p : PiecesOf(lane, from, from + n)) {
    if (p.range < 0) continue;
    const uint32_t before = part_[p.range] == 0 ? 0 : ranges_[p.range].crc;
    Advance(lane, p, Crc32(data + (p.b - from), (p.e - p.b) * 4, before));  // crc32.h: incremental
  }
  lane_done_[lane] = from + n;
}

absl::Status ShardWriter::WriteLane(size_t lane, const float* data, uint64_t n) {
  STRATA_RETURN_IF_ERROR(StartLane(lane));
  const ShardLane& l = lanes_[lane];
  const uint64_t done = lane_done_[lane];
  if (n > l.elems - done) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": shard lane #", lane, ": writing ", n, " floats after ", done, " of ", l.elems));
  }
  Account(lane, data, n);
  STRATA_RETURN_IF_ERROR(file_.Write(data, n * 4, lane_at_[lane] + done * 4));
  if (done + n == l.elems && n > 0) {  // the zeros to the lane's last block's end
    const uint64_t end = lane_at_[lane] + l.elems * 4, tail = RoundUp(end) - end;
    if (tail > 0) STRATA_RETURN_IF_ERROR(file_.Write(kZeros, tail, end));
  }
  return absl::OkStatus();
}

template <typename Visit>
absl::Status ShardWriter::VisitTile(const ClonedTile& tile, uint64_t from, uint64_t to, Visit&& visit) {
  const uint64_t whole = tile.bytes - tile.tail.size();
  if (from < std::min(to, whole)) {
    if (readback_.get() < 0) {  // O_DIRECT where the file system takes it: the clone's bytes are not cached
      int fd = ::open(tmp_.path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (fd < 0 && errno == EINVAL) fd = ::open(tmp_.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Annotate(ErrnoError("open", errno, __FILE__, __LINE__), tmp_.path());
      readback_ = Fd(fd);
      readback_buffer_.reset(static_cast<char*>(std::aligned_alloc(kAlign, kReadBackBytes)));
      if (readback_buffer_ == nullptr) return absl::ResourceExhaustedError("no memory to read a cloned tile back");
    }
    const uint64_t end = std::min(to, whole);
    for (uint64_t block = from / kAlign * kAlign; block < end;) {  // whole blocks of the file, as O_DIRECT reads
      const uint64_t take = std::min<uint64_t>(RoundUp(end) - block, kReadBackBytes);
      STRATA_RETURN_IF_ERROR(ReadAt(readback_.get(), readback_buffer_.get(), take, tile.at + block, tmp_.path()));
      read_back_ += take;
      const uint64_t b = std::max(from, block), e = std::min(end, block + take);
      visit(b, readback_buffer_.get() + (b - block), e - b);
      block += take;
    }
  }
  if (to > whole) {
    const uint64_t b = std::max(from, whole);
    visit(b, tile.tail.data() + (b - whole), to - b);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardWriter::ClonedTile> ShardWriter::CloneTile(size_t lane, const std::vector<CloneSource>& sources,
                                                               uint64_t bytes, uint32_t crc) {
  STRATA_RETURN_IF_ERROR(StartLane(lane));
  const ShardLane& l = lanes_[lane];
  const uint64_t done = lane_done_[lane] * 4;
  const bool last = done + bytes == l.elems * 4;
  if (done % kAlign != 0 || bytes % 4 != 0 || bytes == 0 || bytes > l.elems * 4 - done ||
      (bytes % kAlign != 0 && !last)) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": shard lane #", lane, ": cloning a tile of ", bytes,
                                              " bytes after ", done, " of its ", l.elems * 4, " bytes"));
  }
  ClonedTile tile;
  tile.at = lane_at_[lane] + done;
  tile.bytes = bytes;
  const uint64_t whole = bytes / kAlign * kAlign;
  STRATA_RETURN_IF_ERROR(file_.Resume(tile.at));  // what is pending goes first
  uint64_t cloned = 0;
  for (const CloneSource& s : sources) {
    if (cloned == bytes) break;
    const uint64_t n = std::min(s.bytes, whole - cloned);
    if (n > 0) {
      const absl::Status st = CloneRange(s.fd, s.path, s.offset, file_.fd(), tmp_.path(), tile.at + cloned, n);
      if (!st.ok()) {
        STRATA_RETURN_IF_ERROR(file_.Resume(tile.at));  // the lane is written from here on instead
        return st;
      }
      cloned += n;
    }
    if (cloned == whole && whole < bytes && s.bytes > n) {  // the last partial block lies on in this piece
      tile.tail.resize(bytes - whole);
      STRATA_RETURN_IF_ERROR(ReadAt(s.fd, tile.tail.data(), tile.tail.size(), s.offset + n, s.path));
      cloned = bytes;
    }
  }
  if (cloned != bytes) {
    return absl::InternalError(
        absl::StrCat(path_, ": shard lane #", lane, ": the tile's sources hold ", cloned, " of its ", bytes, " bytes"));
  }
  STRATA_RETURN_IF_ERROR(file_.Resume(tile.at + whole));
  if (!tile.tail.empty()) {  // and the zeros to the lane's last block's end
    STRATA_RETURN_IF_ERROR(file_.Write(tile.tail.data(), tile.tail.size(), tile.at + whole));
    const uint64_t end = tile.at + bytes;
    if (RoundUp(end) > end) STRATA_RETURN_IF_ERROR(file_.Write(kZeros, RoundUp(end) - end, end));
  }
  const uint64_t from = done / 4, to = from + bytes / 4;
  std::vector<Piece> pieces = PiecesOf(lane, from, to);
  size_t largest = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (pieces[p].e - pieces[p].b > pieces[largest].e - pieces[largest].b) largest = p;
  }
  // The pieces before the largest and those after it, each read back in one pass; their CRCs, and the CRCs of all
  // of them before it and all after it.
  auto read = [&](size_t first, size_t end) -> absl::StatusOr<uint32_t> {
    if (first >= end) return 0u;
    size_t p = first;
    STRATA_RETURN_IF_ERROR(VisitTile(tile, (pieces[first].b - from) * 4, (pieces[end - 1].e - from) * 4,
                                     [&](uint64_t at, const char* data, uint64_t n) {
                                       while (n > 0) {
                                         while ((pieces[p].e - from) * 4 <= at) ++p;
                                         const uint64_t take = std::min(n, (pieces[p].e - from) * 4 - at);
                                         pieces[p].crc = Crc32(data, take, pieces[p].crc);
                                         at += take;
                                         data += take;
                                         n -= take;
                                       }
                                     }));
    uint32_t all = 0;
    for (size_t q = first; q < end; ++q) all = Crc32Combine(all, pieces[q].crc, (pieces[q].e - pieces[q].b) * 4);
    return all;
  };
  STRATA_ASSIGN_OR_RETURN(const uint32_t before, read(0, largest));
  STRATA_ASSIGN_OR_RETURN(const uint32_t after, read(largest + 1, pieces.size()));
  Piece& big = pieces[largest];
  big.crc = Crc32Middle(crc, before, after, (big.e - big.b) * 4, (to - big.e) * 4);
  for (const Piece& q : pieces) {
    if (q.range < 0) continue;
    const uint32_t before = ranges_[q.range].crc;
    Advance(lane, q, part_[q.range] == 0 ? q.crc : Crc32Combine(before, q.crc, (q.e - q.b) * 4));
  }
  lane_done_[lane] = to;
  return tile;
}

absl::StatusOr<uint32_t> ShardWriter::ClonedCrc(const ClonedTile& tile) {
  uint32_t crc = 0;
  STRATA_RETURN_IF_ERROR(
      VisitTile(tile, 0, tile.bytes, [&](uint64_t, const char* data, uint64_t n) { crc = Crc32(data, n, crc); }));
  return crc;
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> ShardWriter::Finish() {
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (lane_done_[l] != lanes_[l].elems) {
      return absl::InternalError(
          absl::StrCat(path_, ": shard lane #", l, " written to ", lane_done_[l], " of ", lanes_[l].elems));
    }
  }
  readback_ = Fd();
  for (size_t i = 0; i < ranges_.size(); ++i) {
    if (!written_[i]) return absl::InternalError(absl::StrCat("shard range ", Label(ranges_[i]), " never written"));
  }
  const std::string header = HeaderJson(rank_, world_, ranges_);
  std::string prefix(kMagic, 8);
  const uint64_t len = header.size();
  prefix.append(reinterpret_cast<const char*>(&len), 8);
  prefix += header;
  prefix.resize(header_bytes_, ' ');
  STRATA_RETURN_IF_ERROR(file_.Flush());
  STRATA_RETURN_IF_ERROR(file_.Write(prefix.data(), prefix.size(), 0));
  STRATA_RETURN_IF_ERROR(Fsync(file_.fd(), tmp_.path()));
  file_ = StreamFile();
  STRATA_RETURN_IF_ERROR(RenameDurably(tmp_.path(), path_));
  tmp_.Commit();
  return std::make_pair(Crc32(header.data(), header.size()), end_);
}

namespace {

bool KnownKind(const std::string& kind) { return optim::ParseStateKind(kind).has_value(); }

// One entry of the header's "ranges"; its data must lie in [data_start, size) of the file.
absl::StatusOr<ShardRange> ParseRange(const JsonReader& in, const nlohmann::json& e, const std::string& f,
                                      uint64_t data_start, uint64_t size) {
  STRATA_RETURN_IF_ERROR(in.IsObject(e, f));
  ShardRange s;
  STRATA_ASSIGN_OR_RETURN(s.unit, in.Str(e, "unit", f + ".unit"));
  STRATA_ASSIGN_OR_RETURN(s.param, in.Str(e, "param", f + ".param"));
  STRATA_ASSIGN_OR_RETURN(s.kind, in.Str(e, "kind", f + ".kind"));
  if (!KnownKind(s.kind)) return in.Bad(f + ".kind", absl::StrCat("is '", s.kind, "', not a known state kind"));
  STRATA_ASSIGN_OR_RETURN(s.begin, in.Uint(e, "begin", f + ".begin"));
  STRATA_ASSIGN_OR_RETURN(s.count, in.Uint(e, "count", f + ".count"));
  STRATA_ASSIGN_OR_RETURN(s.offset, in.Uint(e, "offset", f + ".offset"));
  STRATA_ASSIGN_OR_RETURN(s.crc, in.Hex32(e, "crc32", f + ".crc32"));
  uint64_t end = 0, bytes = 0, data_end = 0;
  if (__builtin_add_overflow(s.begin, s.count, &end)) return in.Bad(f + ".count", "+ begin overflows 64 bits");
  if (__builtin_mul_overflow(s.count, uint64_t{4}, &bytes) || __builtin_add_overflow(s.offset, bytes, &data_end) ||
      data_end > size) {
    return in.Bad(f, absl::StrCat("range ", Label(s), " extends past the end of the file (truncated?)"));
  }
  if (s.offset < data_start) return in.Bad(f + ".offset", "points into the header");
  return s;
}

}  // namespace

absl::StatusOr<ShardHeader> ParseShardHeader(absl::string_view header, uint64_t file_size,
                                             absl::string_view path_view) {
  const std::string path(path_view);
  const std::string what = absl::StrCat("checkpoint shard '", path, "' header");
  auto parsed = ParseUntrustedJson(header, what);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint shard '", path, "': corrupt header: ", parsed.status().message()));
  }
  const nlohmann::json& j = *parsed;
  const JsonReader in(what);
  STRATA_RETURN_IF_ERROR(in.IsObject(j, "(top level)"));
  ShardHeader h;
  STRATA_ASSIGN_OR_RETURN(const int64_t world, in.Int(j, "world_size", "world_size", 1, kMaxWorldSize));
  STRATA_ASSIGN_OR_RETURN(const int64_t rank, in.Int(j, "rank", "rank", 0, world - 1));
  h.world_size = static_cast<int>(world);
  h.rank = static_cast<int>(rank);
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json* ranges, in.Array(j, "ranges", "ranges"));
  const uint64_t data_start = 16 + header.size();
  std::set<std::string> seen;
  for (size_t i = 0; i < ranges->size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(ShardRange s, ParseRange(in, (*ranges)[i], Index("ranges", i), data_start, file_size));
    if (!seen.insert(absl::StrCat(s.unit, "\n", s.param, "\n", s.kind)).second) {
      return in.Bad(Index("ranges", i), absl::StrCat("repeats range ", Label(s)));
    }
    h.ranges.push_back(std::move(s));
  }
  return h;
}

absl::StatusOr<ShardReader> ShardReader::Open(const std::string& dir, const std::string& file,
                                              const uint32_t* expected_checksum, const uint64_t* expected_size) {
  ShardReader r;
  const std::string path = (std::filesystem::path(dir) / file).string();
  r.path_ = path;
  auto fd = OpenInDir(dir, file);
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kPermissionDenied) return fd.status();
    return absl::NotFoundError(absl::StrCat("checkpoint shard '", path, "' is missing or unreadable: ",
                                            fd.status().message()));
  }
  r.fd_ = std::move(*fd);
  STRATA_ASSIGN_OR_RETURN(uint64_t size, FileSize(r.fd_.get(), path));
  if (expected_size != nullptr && size != *expected_size) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "' has ", size, " bytes; the manifest says ",
                                            *expected_size, " (truncated or replaced)"));
  }
  char head[16];
  const absl::Status bad_magic =
      absl::DataLossError(absl::StrCat("'", path, "' is not a strata checkpoint shard (bad magic or header)"));
  if (size < 16) return bad_magic;
  STRATA_RETURN_IF_ERROR(ReadAt(r.fd_.get(), head, 16, 0, path));
  uint64_t len = 0;
  std::memcpy(&len, head + 8, 8);
  if (std::memcmp(head, kMagic, 8) != 0 || len > size - 16 || len > kMaxShardHeaderBytes) return bad_magic;
  std::string header(len, '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(r.fd_.get(), header.data(), len, 16, path));
  if (expected_checksum != nullptr && Crc32(header.data(), header.size()) != *expected_checksum) {
    return absl::DataLossError(
        absl::StrCat("checkpoint shard '", path, "': header checksum differs from the manifest"));
  }
  STRATA_ASSIGN_OR_RETURN(ShardHeader h, ParseShardHeader(header, size, path));
  r.rank_ = h.rank;
  r.world_ = h.world_size;
  r.ranges_ = std::move(h.ranges);
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
