#include "runtime/checkpoint/publish.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/shard_file.h"
#include "runtime/comm/agree.h"

namespace strata::checkpoint {

std::string ShardName(int rank) { return absl::StrFormat("shard_%05d.bin", rank); }

namespace {

// Note [Visible shards]. Each rank writes its shard where it sees `step_dir`; rank 0 publishes the manifest
// for all of them. When the directory is not one shared file system (node-local disks, a path mounted
// differently per node), every save used to be reported and no checkpoint could ever load (issue 33). So
// before publishing, rank 0 opens each shard it lists and checks its header's checksum and the file's size
// against what the writer reported: a few KiB read per shard, never the data. The header's checksum covers
// every range's CRC, so a stale file of the same name from another save fails too, unless its bytes are
// the same. A shard not yet visible (a network file system's caches) is retried for up to two seconds (and a
// quarter of the collective timeout at most).
absl::Status CheckShardsVisible(const std::string& step_dir, const std::vector<ShardReport>& all, int64_t timeout_ms) {
  // The retries stay well inside the peers' deadline, which they wait under meanwhile.
  const int attempts = static_cast<int>(std::clamp<int64_t>(timeout_ms / 400, 1, 20));
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].shard < 0) continue;
    const std::string name = ShardName(all[r].shard);
    absl::Status seen;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      seen = ShardReader::Open(step_dir, name, &all[r].checksum, &all[r].bytes).status();
      if (seen.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!seen.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " wrote its shard '", name, "' but rank 0 does not see it in '", step_dir, "' (", seen.message(),
          "): the checkpoint directory must be one directory that every rank shares (a shared or parallel file "
          "system), not a disk local to each node; nothing was published"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardReports> GatherShardReports(comm::Communicator& control, device::Stream& stream, ShardReport mine,
                                                const absl::Status& local) {
  mine.ok = local.ok() ? 1 : 0;
  if (!local.ok()) {
    STRATA_LOG(Error) << "writing checkpoint shard: " << local.message();
  }
  ShardReports reports;
  reports.all.resize(control.size());
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(control, &mine, reports.all.data(), sizeof(ShardReport), stream).Wait());
  for (int r = 0; r < control.size(); ++r) {
    if (!reports.all[r].ok) reports.failed.push_back(r);
  }
  reports.needs_manifest = control.rank() == 0 && reports.failed.empty();
  return reports;
}

absl::Status PublishCheckpoint(comm::Communicator& control, device::Stream& stream, const std::string& step_dir,
                               const ShardReports& reports, const absl::Status& local, Manifest manifest) {
  absl::Status published;  // rank 0's publication; every rank learns its outcome, with the cause
  if (reports.needs_manifest) {
    Manifest& man = manifest;
    for (const ShardReport& report : reports.all) {
      if (report.shard >= 0)
        man.shards.push_back({report.shard, ShardName(report.shard), report.bytes, report.checksum});
    }
    published = CheckShardsVisible(step_dir, reports.all, control.options().timeout_ms);
    const std::string manifest_path = (std::filesystem::path(step_dir) / kManifestName).string();
    if (published.ok()) published = Annotate(WriteFileAtomic(manifest_path, ToJson(man)), "writing the manifest");
  }
  const absl::Status agreed = comm::AgreeOnOutcome(published, "publishing the checkpoint", control, stream);
  if (!reports.failed.empty()) {
    return absl::Status(
        local.ok() ? absl::StatusCode::kAborted : local.code(),
        absl::StrCat("checkpoint '", step_dir, "' was not published: rank(s) ", absl::StrJoin(reports.failed, ","),
                     " could not write their shard", local.ok() ? "" : absl::StrCat(" (here: ", local.message(), ")")));
  }
  return Annotate(agreed, absl::StrCat("checkpoint '", step_dir, "' was not published"));
}

}  // namespace strata::checkpoint
