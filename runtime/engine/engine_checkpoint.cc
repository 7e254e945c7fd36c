// Sharded checkpoints of the engine (docs/design.md "Checkpoints"): save this rank's slice of master weights and
// optimizer state, publish the manifest last; load at any world size by global offsets.
//
// Protocol of SaveCheckpoint (every rank): write and publish its shard file; all-gather (checksum,
// size, ok) so rank 0 knows every shard is durable; rank 0 writes the manifest (temporary name, fsync,
// rename); an all-reduce of rank 0's result makes every rank return the same verdict. A rank that fails
// still takes part in both collectives, so nobody waits on it; the manifest is written only when every
// shard succeeded, so a failed or interrupted save never publishes a partial checkpoint. A failed write
// removes its temporary (TempFile); before writing, each rank removes the temporaries an earlier, dead
// save left for its shard (rank 0 also those of the manifest and of ranks beyond this world size).
//
// Hybrid sharding (engine_groups.cc): the replicas of a shard group hold the same state, so only shard
// group 0 (the one of world rank 0) writes, one file per shard rank, and the checkpoint is that of a
// G-rank job (manifest world_size = G) that records the replicas; each copy writing the same bytes would
// multiply the I/O and the disk by N / G for nothing. Every rank still takes part in both collectives.
// Loading at any N and G is then the usual resharding from G shards.
#include <algorithm>
#include <chrono>
#include <thread>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/checkpoint/shard_file.h"
#include "runtime/comm/agree.h"
#include "runtime/engine/engine_impl.h"

namespace strata::engine {

namespace ckpt = checkpoint;

namespace {

std::string ShardName(int rank) { return absl::StrFormat("shard_%05d.bin", rank); }

// Each kind over the update range, staged in host memory one unit at a time, wherever it lives
// (ReadState; Note [NVMe state]).
absl::StatusOr<std::vector<float*>> KindBuffers(Engine::Impl& m, UnitState& u,
                                                std::vector<std::vector<float>>* staged) {
  staged->clear();
  std::vector<float*> out;
  for (optim::StateKind k : m.state_kinds(u)) {
    STRATA_ASSIGN_OR_RETURN(std::vector<float> values, m.ReadState(u, k));
    staged->push_back(std::move(values));
  }
  for (auto& v : *staged) out.push_back(v.data());
  return out;
}

ckpt::ManifestUnit ManifestUnitOf(const UnitState& u) {
  ckpt::ManifestUnit mu{u.layout.name, {}};
  for (size_t i = 0; i < u.layout.params.size(); ++i) {
    const shard::ParamSlot& p = u.layout.params[i];
    mu.params.push_back({p.spec.name, p.spec.shape, p.offset_elems, p.numel, p.spec.weight_decay, p.spec.frozen,
                         u.skipped_steps[i], p.spec.own_lr, p.spec.own_weight_decay});
  }
  return mu;
}

absl::Status WriteShard(Engine::Impl& m, const std::string& path, uint32_t* checksum, uint64_t* bytes) {
  const size_t r = static_cast<size_t>(m.rt.shard_rank);
  std::vector<ckpt::ShardRange> ranges;
  std::vector<std::pair<size_t, size_t>> where;  // (unit, kind) of each range
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    const UnitState& u = m.units[ui];
    std::vector<std::string> kinds;  // a frozen unit's master alone (Note [Frozen units])
    for (optim::StateKind k : m.state_kinds(u)) kinds.emplace_back(optim::StateKindName(k));
    const size_t lo = r * u.layout.shard_elems;
    for (ckpt::SaveRange& s : ckpt::RangesToSave(ManifestUnitOf(u), lo, lo + u.layout.shard_elems, kinds)) {
      ranges.push_back(std::move(s.range));
      where.emplace_back(ui, s.kind);
    }
  }
  STRATA_ASSIGN_OR_RETURN(ckpt::ShardWriter w,
                          ckpt::ShardWriter::Create(path, m.rt.shard_rank, m.rt.shard_size(), ranges));
  std::vector<std::vector<float>> staged;
  std::vector<float*> buffers;
  size_t staged_unit = SIZE_MAX;
  for (size_t i = 0; i < ranges.size(); ++i) {
    UnitState& u = m.units[where[i].first];
    if (where[i].first != staged_unit) {
      STRATA_ASSIGN_OR_RETURN(buffers, KindBuffers(m, u, &staged));
      staged_unit = where[i].first;
    }
    STRATA_RETURN_IF_ERROR(w.Write(i, buffers[where[i].second] + (ranges[i].begin - m.update_begin(u))));
  }
  STRATA_ASSIGN_OR_RETURN(auto done, w.Finish());
  *checksum = done.first;
  *bytes = done.second;
  return absl::OkStatus();
}

ckpt::Manifest BuildManifest(Engine::Impl& m, const std::string& trainer_json) {
  ckpt::Manifest man;
  man.step = m.progress.step;
  man.world_size = m.rt.shard_size();
  man.replicas = m.rt.groups.replicas;
  man.stage = m.cfg.stage;
  man.param_dtype = std::string(DTypeName(m.cfg.param_dtype));
  man.optimizer = m.cfg.optimizer.type == OptimizerType::kAdamW ? "adamw" : "sgd";
  man.loss_scale = m.progress.loss_scaler.scale();
  man.clean_steps = m.progress.loss_scaler.clean_steps();
  if (m.progress.loss_scaler.dynamic()) man.loss_scale_hysteresis = m.progress.loss_scaler.hysteresis_left();
  man.trainer_json = trainer_json;
  for (const UnitState& u : m.units) {
    man.units.push_back(ManifestUnitOf(u));
    // Frozen parameters need format 2; without them the manifest stays the format-1 document it was.
    if (u.frozen()) man.version = std::max(man.version, ckpt::kFrozenManifestVersion);
    for (int64_t s : u.skipped_steps) {  // Note [Parameters without a gradient]: format 3 only when needed
      if (s > 0) man.version = std::max(man.version, ckpt::kSkippedManifestVersion);
    }
    for (const shard::ParamSlot& p : u.layout.params) {  // Note [Param groups]: format 4 only when needed
      if (p.spec.own_lr || p.spec.own_weight_decay) man.version = ckpt::kOwnHyperManifestVersion;
    }
  }
  return man;
}

// Temporaries of this rank's files that an earlier save, now dead, left in `step_dir`: this process has
// not created its own yet, and no other rank of this job writes these names.
void RemoveStaleTemps(const Engine::Impl& m, const std::string& step_dir) {
  const std::string mine = ShardName(m.rt.shard_rank) + ".tmp.";
  const int rank = m.rank(), world = m.rt.shard_size();
  auto removed = ckpt::RemoveTemps(step_dir, [&](absl::string_view name) {
    if (absl::StartsWith(name, mine)) return true;
    if (rank != 0) return false;
    if (absl::StartsWith(name, std::string(ckpt::kManifestName) + ".tmp.")) return true;
    int other = 0;  // shard_NNNNN.bin.tmp.* of a rank this job does not have
    return name.size() > 11 && absl::StartsWith(name, "shard_") && absl::SimpleAtoi(name.substr(6, 5), &other) &&
           other >= world && absl::StartsWith(name.substr(11), ".bin.tmp.");
  });
  if (!removed.ok()) {
    STRATA_LOG(Warning) << "cannot remove stale temporaries in " << step_dir << ": " << removed.status().message();
  } else if (!removed->empty()) {
    STRATA_LOG(Warning) << "removed " << removed->size() << " stale temporary file(s) of an earlier, interrupted "
                        << "save from " << step_dir << ": " << absl::StrJoin(*removed, ", ");
  }
}

// Every rank's (checksum, size, ok) as 16-bit words: the collective moves raw bytes.
struct ShardReport {
  uint32_t checksum;
  uint32_t ok;
  uint64_t bytes;
  int32_t shard;  // the shard rank whose file this rank wrote, or -1 (a replica that writes nothing)
  uint32_t unused;
};

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
      seen = ckpt::ShardReader::Open(step_dir, name, &all[r].checksum, &all[r].bytes).status();
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

// Shard group 0 writes the checkpoint (the file note says why).
bool WritesShard(const Engine::Impl& m) { return m.rt.groups.shard_color == 0; }

}  // namespace

absl::Status Engine::SaveCheckpoint(const std::string& step_dir, const std::string& trainer_json) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "SaveCheckpoint"));
  if (m.progress.in_micro_batch || m.progress.micro_batch != 0) {
    return absl::FailedPreconditionError("SaveCheckpoint() between micro-batches of a step; call it after Step()");
  }
  const std::string manifest_path = (std::filesystem::path(step_dir) / ckpt::kManifestName).string();
  std::error_code exists_error;  // the non-throwing overload: a path that cannot be examined fails below
  if (std::filesystem::exists(manifest_path, exists_error)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint '", step_dir, "' already exists (complete)"));
  }
  ShardReport mine{0, 0, 0, WritesShard(m) ? m.rt.shard_rank : -1, 0};
  absl::Status local = ckpt::CheckTrainerState(trainer_json);
  if (local.ok() && WritesShard(m)) {
    local = ckpt::MakeDirs(step_dir);
    if (local.ok()) {
      RemoveStaleTemps(m, step_dir);
      local = WriteShard(m, (std::filesystem::path(step_dir) / ShardName(m.rt.shard_rank)).string(), &mine.checksum,
                         &mine.bytes);
    }
  }
  mine.ok = local.ok() ? 1 : 0;
  if (!local.ok()) {
    STRATA_LOG(Error) << "writing checkpoint shard: " << local.message();
  }
  std::vector<ShardReport> all(m.world_size());
  STRATA_RETURN_IF_ERROR(
      comm::AllGatherBytes(*m.rt.control, &mine, all.data(), sizeof(ShardReport), *m.rt.control_stream).Wait());
  std::vector<int> failed;
  for (int r = 0; r < m.world_size(); ++r) {
    if (!all[r].ok) failed.push_back(r);
  }
  absl::Status manifest;  // rank 0's publication; every rank learns its outcome, with the cause
  if (m.rank() == 0 && failed.empty()) {
    ckpt::Manifest man = BuildManifest(m, trainer_json);
    for (const ShardReport& report : all) {
      if (report.shard >= 0)
        man.shards.push_back({report.shard, ShardName(report.shard), report.bytes, report.checksum});
    }
    manifest = CheckShardsVisible(step_dir, all, m.rt.control->options().timeout_ms);
    if (manifest.ok())
      manifest = Annotate(ckpt::WriteFileAtomic(manifest_path, ckpt::ToJson(man)), "writing the manifest");
  }
  const absl::Status published =
      comm::AgreeOnOutcome(manifest, "publishing the checkpoint", *m.rt.control, *m.rt.control_stream);
  if (!failed.empty()) {
    return absl::Status(local.ok() ? absl::StatusCode::kAborted : local.code(),
                        absl::StrCat("checkpoint '", step_dir, "' was not published: rank(s) ",
                                     absl::StrJoin(failed, ","), " could not write their shard",
                                     local.ok() ? "" : absl::StrCat(" (here: ", local.message(), ")")));
  }
  return Annotate(published, absl::StrCat("checkpoint '", step_dir, "' was not published"));
}

}  // namespace strata::engine
