#include "runtime/checkpoint/consolidate.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/shard_file.h"

namespace strata::checkpoint {

namespace fs = std::filesystem;

absl::StatusOr<Manifest> ReadManifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifestName).string();
  auto text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", step_dir, "' has no readable manifest (incomplete or "
                                            "not a checkpoint): ", text.status().message()));
  }
  return ParseManifest(*text, path);
}

absl::StatusOr<std::vector<float>> ReadMasterParam(const std::string& step_dir, const Manifest& m, size_t unit,
                                                   size_t param) {
  const ManifestUnit& u = m.units.at(unit);
  const ManifestParam& p = u.params.at(param);
  std::vector<float> out(p.numel), buf;
  uint64_t filled = 0;
  for (const ManifestShard& s : m.shards) {
    STRATA_ASSIGN_OR_RETURN(ShardReader r, ShardReader::Open((fs::path(step_dir) / s.file).string(), &s.checksum, &s.bytes));
    const ShardRange* range = r.Find(u.name, p.name, "master");
    if (range == nullptr) continue;
    STRATA_RETURN_IF_ERROR(r.Read(*range, &buf));
    if (range->begin < p.offset || range->begin + range->count > p.offset + p.numel) {
      return absl::DataLossError(absl::StrCat("checkpoint shard '", s.file, "': range of ", u.name, ".", p.name,
                                              " lies outside the parameter"));
    }
    std::copy(buf.begin(), buf.end(), out.begin() + (range->begin - p.offset));
    filled += range->count;
  }
  if (filled != p.numel) {
    return absl::DataLossError(absl::StrCat("checkpoint '", step_dir, "': the shards hold ", filled, " of the ",
                                            p.numel, " elements of ", u.name, ".", p.name));
  }
  return out;
}

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& step_dir, const Manifest& m) {
  VerifyReport rep;
  std::vector<float> buf;
  for (const ManifestShard& s : m.shards) {
    STRATA_ASSIGN_OR_RETURN(ShardReader r, ShardReader::Open((fs::path(step_dir) / s.file).string(), &s.checksum, &s.bytes));
    for (const ShardRange& range : r.ranges()) {
      STRATA_RETURN_IF_ERROR(r.Read(range, &buf));
      ++rep.ranges;
    }
    ++rep.files;
    rep.bytes += s.bytes;
  }
  return rep;
}

}  // namespace strata::checkpoint
