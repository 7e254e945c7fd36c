#include "runtime/checkpoint/consolidate.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/optim/state_kind.h"

namespace strata::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string ManifestPath(const std::string& step_dir) { return (fs::path(step_dir) / kManifestName).string(); }

absl::Status CheckStepMatchesDir(const Manifest& m, const std::string& step_dir) {
  fs::path dir = fs::path(step_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  const std::optional<int64_t> named = ParseStepDirName(dir.filename().string());
  if (named.has_value() && m.step > *named) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", ManifestPath(step_dir), "' field 'step' is ",
                                            m.step, ", past the step its directory is named for (", *named,
                                            "): a renamed or mixed-up checkpoint"));
  }
  return absl::OkStatus();
}

// Sorted [begin, end) intervals must tile [lo, hi) exactly; otherwise DataLoss naming `what`.
absl::Status CheckTiles(std::vector<std::pair<uint64_t, uint64_t>> tiles, uint64_t lo, uint64_t hi,
                        const std::string& what) {
  std::sort(tiles.begin(), tiles.end());
  uint64_t at = lo;
  for (const auto& [b, e] : tiles) {
    if (b != at) {
      return absl::DataLossError(absl::StrCat(what, ": elements [", std::min(b, at), ", ", std::max(b, at), ") are ",
                                              b > at ? "in no shard" : "in more than one shard"));
    }
    at = e;
  }
  if (at != hi) {
    return absl::DataLossError(absl::StrCat(what, ": elements [", std::min(at, hi), ", ", std::max(at, hi), ") are ",
                                            at < hi ? "in no shard" : "outside the parameter"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir) {
  auto text = ReadFileInDir(step_dir, kManifestName, kMaxManifestBytes);
  if (!text.ok()) {
    const absl::StatusCode code = text.status().code();
    if (code == absl::StatusCode::kPermissionDenied || code == absl::StatusCode::kResourceExhausted) {
      return Annotate(text.status(), "checkpoint manifest");
    }
    return absl::NotFoundError(absl::StrCat("checkpoint '", step_dir, "' has no readable manifest (incomplete or "
                                            "not a checkpoint): ", text.status().message()));
  }
  STRATA_ASSIGN_OR_RETURN(Manifest m, ParseManifest(*text, ManifestPath(step_dir)));
  STRATA_RETURN_IF_ERROR(CheckStepMatchesDir(m, step_dir));
  return m;
}

absl::StatusOr<ShardReader> OpenShard(const std::string& step_dir, const Manifest& m, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= m.shards.size() || m.shards[rank].rank != rank) {
    return absl::DataLossError(absl::StrCat("checkpoint '", step_dir, "' lists no shard for rank ", rank));
  }
  const ManifestShard& s = m.shards[rank];
  auto r = ShardReader::Open(step_dir, s.file, &s.checksum, &s.bytes);
  if (!r.ok() && r.status().code() == absl::StatusCode::kPermissionDenied) {
    return Annotate(r.status(), absl::StrCat("checkpoint manifest '", ManifestPath(step_dir), "' field 'shards[",
                                             rank, "].file' ('", s.file, "')"));
  }
  if (!r.ok()) return r.status();
  if (r->rank() != rank || r->world_size() != m.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", s.file, "' in '", step_dir, "' belongs to rank ",
                                            r->rank(), " of ", r->world_size(), "; the manifest lists it for rank ",
                                            rank, " of ", m.world_size, " (a shard from another checkpoint?)"));
  }
  return r;
}

absl::StatusOr<std::vector<float>> ReadMasterParam(const std::string& step_dir, const Manifest& m, size_t unit,
                                                   size_t param) {
  if (unit >= m.units.size() || param >= m.units[unit].params.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("checkpoint '", step_dir, "' has no parameter #", param, " of unit #", unit));
  }
  const ManifestUnit& u = m.units[unit];
  const ManifestParam& p = u.params[param];
  const std::string what = absl::StrCat("checkpoint '", step_dir, "': ", u.name, ".", p.name, " master");
  std::vector<std::pair<ShardReader, size_t>> parts;  // (shard, index of its range)
  std::vector<std::pair<uint64_t, uint64_t>> tiles;
  for (const ManifestShard& s : m.shards) {
    STRATA_ASSIGN_OR_RETURN(ShardReader r, OpenShard(step_dir, m, s.rank));
    const ShardRange* range = r.Find(u.name, p.name, std::string(optim::StateKindName(optim::StateKind::kMaster)));
    if (range == nullptr) continue;
    tiles.emplace_back(range->begin, range->begin + range->count);  // no overflow: checked when parsed
    const size_t index = static_cast<size_t>(range - r.ranges().data());
    parts.emplace_back(std::move(r), index);
  }
  // Every shard is open and its real size equals the manifest's, which bounds numel (ParseManifest).
  STRATA_RETURN_IF_ERROR(CheckTiles(tiles, p.offset, p.offset + p.numel, what));
  std::vector<float> out(p.numel), buf;
  for (const auto& [reader, index] : parts) {
    const ShardRange& range = reader.ranges()[index];
    STRATA_RETURN_IF_ERROR(reader.Read(range, &buf));
    CopyOverlap(range, buf, p.offset, p.offset + p.numel, out.data());
  }
  return out;
}

namespace {

// VerifyCheckpoint, reading every range's data (and so its checksum) only when `read_data`.
absl::StatusOr<VerifyReport> Coverage(const std::string& step_dir, const Manifest& m, bool read_data) {
  VerifyReport rep;
  std::vector<float> buf;
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, std::vector<std::pair<uint64_t, uint64_t>>> tiles;
  for (const ManifestUnit& u : m.units) {
    for (const ManifestParam& p : u.params) {
      for (const std::string& kind : StateKinds(m.optimizer, p)) tiles[Key{u.name, p.name, kind}];
    }
  }
  for (const ManifestShard& s : m.shards) {
    STRATA_ASSIGN_OR_RETURN(ShardReader r, OpenShard(step_dir, m, s.rank));
    for (const ShardRange& range : r.ranges()) {
      auto it = tiles.find(Key{range.unit, range.param, range.kind});
      if (it == tiles.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint shard '", s.file, "' in '", step_dir, "' holds ",
                                                range.unit, ".", range.param, " ", range.kind,
                                                ", which the manifest does not list"));
      }
      it->second.emplace_back(range.begin, range.begin + range.count);
      if (read_data) STRATA_RETURN_IF_ERROR(r.Read(range, &buf));
      ++rep.ranges;
    }
    ++rep.files;
    rep.bytes += s.bytes;
  }
  for (const ManifestUnit& u : m.units) {
    for (const ManifestParam& p : u.params) {
      for (const std::string& kind : StateKinds(m.optimizer, p)) {
        const std::string what = absl::StrCat("checkpoint '", step_dir, "': ", u.name, ".", p.name, " ", kind);
        STRATA_RETURN_IF_ERROR(CheckTiles(tiles[Key{u.name, p.name, kind}], p.offset, p.offset + p.numel, what));
      }
    }
  }
  return rep;
}

}  // namespace

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& step_dir, const Manifest& m) {
  return Coverage(step_dir, m, /*read_data=*/true);
}

absl::Status CheckCoverage(const std::string& step_dir, const Manifest& m) {
  return Coverage(step_dir, m, /*read_data=*/false).status();
}

}  // namespace strata::checkpoint
