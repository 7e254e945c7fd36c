// Sharded checkpoints of the engine (docs/design.md "Checkpoints"): save this rank's slice of master weights and
// optimizer state, publish the manifest last; load at any world size by global offsets.
//
// Protocol of SaveCheckpoint (every rank): write and publish its shard file, then the collective publication
// of runtime/checkpoint/publish.h (manifest last, by rank 0, only when every shard succeeded), so a failed or
// interrupted save never publishes a partial checkpoint. A failed write removes its temporary (TempFile);
// before writing, each rank removes the temporaries an earlier, dead save left for its shard (rank 0 also
// those of the manifest and of ranks beyond this world size). SaveCheckpointAsync writes the same files
// from a snapshot, in the background (Note [Asynchronous checkpoints] in runtime/checkpoint/async_save.h).
//
// Hybrid sharding (engine_groups.cc): the replicas of a shard group hold the same state, so only shard
// group 0 (the one of world rank 0) writes, one file per shard rank, and the checkpoint is that of a
// G-rank job (manifest world_size = G) that records the replicas; each copy writing the same bytes would
// multiply the I/O and the disk by N / G for nothing. Every rank still takes part in both collectives.
// Loading at any N and G is then the usual resharding from G shards.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/publish.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/checkpoint/shard_file.h"
#include "runtime/engine/engine_impl.h"

namespace strata::engine {

namespace ckpt = checkpoint;

namespace {

// Each kind over the update range, staged in host memory one unit at a time, wherever it lives
// (StateOwner::Read; Note [NVMe state]).
absl::StatusOr<std::vector<float*>> KindBuffers(Engine::Impl& m, UnitState& u,
                                                std::vector<std::vector<float>>* staged) {
  staged->clear();
  std::vector<float*> out;
  for (optim::StateKind k : u.state->kinds()) {
    STRATA_ASSIGN_OR_RETURN(std::vector<float> values, u.state->Read(u, k));
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

// The ranges of this rank's shard file and, for each, its (unit, kind); the lanes of NVMe state (Note [NVMe lanes
// laid out as tiles] in checkpoint/shard_file.h): each kind of a unit whose state is tiled, over its update range.
struct ShardPlan {
  std::vector<ckpt::ShardRange> ranges;
  std::vector<std::pair<size_t, size_t>> where;
  std::vector<ckpt::ShardLane> lanes;
};

ShardPlan PlanShard(const Engine::Impl& m) {
  const size_t r = static_cast<size_t>(m.rt.shard_rank);
  ShardPlan plan;
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    const UnitState& u = m.units[ui];
    std::vector<std::string> kinds;  // a frozen unit's master alone (Note [Frozen units])
    for (optim::StateKind k : u.state->kinds()) kinds.emplace_back(optim::StateKindName(k));
    const size_t lo = r * u.layout.shard_elems;
    for (ckpt::SaveRange& s : ckpt::RangesToSave(ManifestUnitOf(u), lo, lo + u.layout.shard_elems, kinds)) {
      if (u.state->tiled()) {  // ranges come kind by kind: a kind's first range opens its lane
        if (plan.where.empty() || plan.where.back() != std::make_pair(ui, s.kind)) {
          plan.lanes.push_back({plan.ranges.size(), plan.ranges.size(), u.update_begin(), u.update_elems()});
        }
        plan.lanes.back().end = plan.ranges.size() + 1;
      }
      plan.ranges.push_back(std::move(s.range));
      plan.where.emplace_back(ui, s.kind);
    }
  }
  return plan;
}

absl::Status WriteShard(Engine::Impl& m, const std::string& path, uint32_t* checksum, uint64_t* bytes) {
  ShardPlan plan = PlanShard(m);
  const std::vector<std::pair<size_t, size_t>>& where = plan.where;
  const std::vector<ckpt::ShardRange> ranges = plan.ranges;
  STRATA_ASSIGN_OR_RETURN(ckpt::ShardWriter w, ckpt::ShardWriter::Create(path, m.rt.shard_rank, m.rt.shard_size(),
                                                                         std::move(plan.ranges), plan.lanes));
  std::vector<std::vector<float>> staged;
  std::vector<float*> buffers;
  size_t staged_unit = SIZE_MAX;
  for (size_t i = 0; i < ranges.size(); ++i) {
    UnitState& u = m.units[where[i].first];
    if (where[i].first != staged_unit) {
      STRATA_ASSIGN_OR_RETURN(buffers, KindBuffers(m, u, &staged));
      staged_unit = where[i].first;
    }
    if (const int lane = w.lane_of(i); lane < 0) {
      STRATA_RETURN_IF_ERROR(w.Write(i, buffers[where[i].second] + (ranges[i].begin - u.update_begin())));
    } else if (i == plan.lanes[lane].first) {  // the whole lane, padding included
      STRATA_RETURN_IF_ERROR(w.WriteLane(lane, buffers[where[i].second], u.update_elems()));
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto done, w.Finish());
  *checksum = done.first;
  *bytes = done.second;
  return absl::OkStatus();
}

// Note [Asynchronous checkpoints]: the ranges WriteShard writes, with every unit's kinds copied into host
// memory (from what StateOwner::Lend lends on the host tiers; else staged by StateOwner::Read, from the device)
// instead of one unit at a time, except the kinds the state store snapshots without a copy (NVMe tiles: Note
// [Snapshots of NVMe state] in optim/nvme_state.h), whose buffers stay empty. The copies go into `spare`, the
// buffers of the save before, when it has them: pages touched once, so the copy is not slowed down by page
// faults on fresh memory.
absl::StatusOr<ckpt::ShardSnapshot> Snapshot(Engine::Impl& m, std::vector<std::vector<float>> spare) {
  ShardPlan plan = PlanShard(m);
  ckpt::ShardSnapshot snap;
  size_t staged_unit = SIZE_MAX, first_buffer = 0;
  for (size_t i = 0; i < plan.ranges.size(); ++i) {
    UnitState& u = m.units[plan.where[i].first];
    if (plan.where[i].first != staged_unit) {
      first_buffer = snap.buffers.size();
      for (optim::StateKind k : u.state->kinds()) {
        snap.lanes.push_back(u.state->Snapshot(u, k));
        if (snap.lanes.back() != nullptr) {
          snap.buffers.emplace_back();
          continue;
        }
        std::vector<float> values;
        if (snap.buffers.size() < spare.size()) values = std::move(spare[snap.buffers.size()]);
        values.resize(u.update_elems());
        if (const auto lent = u.state->Lend(u, k)) {  // in place
          std::copy(lent->begin(), lent->begin() + values.size(), values.data());
        } else {  // staged
          STRATA_ASSIGN_OR_RETURN(const std::vector<float> staged, u.state->Read(u, k));
          std::copy(staged.begin(), staged.begin() + values.size(), values.data());
        }
        snap.buffers.push_back(std::move(values));
      }
      staged_unit = plan.where[i].first;
    }
    snap.at.emplace_back(first_buffer + plan.where[i].second, plan.ranges[i].begin - u.update_begin());
  }
  snap.ranges = std::move(plan.ranges);
  snap.tiled = std::move(plan.lanes);
  return snap;
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
    // Frozen parameters need format 2; without them the manifest stays the format-1 document it was. (A
    // unit is frozen as a whole: Note [Frozen units].)
    for (const ckpt::ManifestParam& p : man.units.back().params) {
      if (p.frozen) man.version = std::max(man.version, ckpt::kFrozenManifestVersion);
    }
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
  const std::string mine = ckpt::ShardName(m.rt.shard_rank) + ".tmp.";
  const int rank = m.rt.rank(), world = m.rt.shard_size();
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

// Shard group 0 writes the checkpoint (the file note says why).
bool WritesShard(const Engine::Impl& m) { return m.rt.groups.shard_color == 0; }

// Refuses a save between micro-batches or into a complete checkpoint (both kinds of save).
absl::Status CheckSave(const Engine::Impl& m, const std::string& step_dir, const char* what) {
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, what));
  if (m.progress.in_micro_batch || m.progress.micro_batch != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "() between micro-batches of a step; call it after Step()"));
  }
  const std::string manifest_path = (std::filesystem::path(step_dir) / ckpt::kManifestName).string();
  std::error_code exists_error;  // the non-throwing overload: a path that cannot be examined fails below
  if (std::filesystem::exists(manifest_path, exists_error)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint '", step_dir, "' already exists (complete)"));
  }
  return absl::OkStatus();
}

// Before this rank writes its shard into `step_dir`: the trainer state is one a manifest holds, and (when
// it writes one) the directory exists without this rank's stale temporaries.
absl::Status PrepareStepDir(const Engine::Impl& m, const std::string& step_dir, const std::string& trainer_json) {
  STRATA_RETURN_IF_ERROR(ckpt::CheckTrainerState(trainer_json));
  if (!WritesShard(m)) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(ckpt::MakeDirs(step_dir));
  RemoveStaleTemps(m, step_dir);
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::SaveCheckpoint(const std::string& step_dir, const std::string& trainer_json) {
  Impl& m = *impl_;
  if (async_saver_ != nullptr) STRATA_RETURN_IF_ERROR(async_saver_->Drain(step_dir));  // one at a time
  STRATA_RETURN_IF_ERROR(CheckSave(m, step_dir, "SaveCheckpoint"));
  ckpt::ShardReport mine;
  mine.shard = WritesShard(m) ? m.rt.shard_rank : -1;
  absl::Status local = PrepareStepDir(m, step_dir, trainer_json);
  if (local.ok() && WritesShard(m)) {
    local = WriteShard(m, (std::filesystem::path(step_dir) / ckpt::ShardName(m.rt.shard_rank)).string(), &mine.checksum,
                       &mine.bytes);
  }
  STRATA_ASSIGN_OR_RETURN(const ckpt::ShardReports reports,
                          ckpt::GatherShardReports(*m.rt.control, *m.rt.control_stream, mine, local));
  ckpt::Manifest man;  // rank 0's, once every rank wrote its shard
  if (reports.needs_manifest) man = BuildManifest(m, trainer_json);
  return ckpt::PublishCheckpoint(*m.rt.control, *m.rt.control_stream, step_dir, reports, local, std::move(man));
}

namespace {
// The saver's collectives wait for writers that may hold cloned tiles for kCloneHoldMs first, then read them back
// (decision 0058): the hold, and as much again for the read-back, on top of the training's deadline (of which the
// liveness check takes its part).
int64_t SaverTimeoutMs(int64_t training_ms) {
  return training_ms > 0 ? training_ms + 2 * ckpt::kCloneHoldMs : training_ms;
}
}  // namespace

absl::Status Engine::SaveCheckpointAsync(const std::string& step_dir, const std::string& trainer_json) {
  Impl& m = *impl_;
  if (async_saver_ != nullptr) STRATA_RETURN_IF_ERROR(async_saver_->Drain(step_dir));  // one in flight
  STRATA_RETURN_IF_ERROR(CheckSave(m, step_dir, "SaveCheckpointAsync"));
  if (async_saver_ == nullptr) {  // its own communicator, so its collectives never meet the training's
    STRATA_RETURN_IF_ERROR(m.rt.control_stream->Synchronize());
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> control,
                            m.rt.control->Dup("checkpoint", SaverTimeoutMs(m.cfg.collective_timeout_ms)));
    async_saver_ = std::make_unique<ckpt::AsyncSaver>(std::move(control));
  }
  ckpt::AsyncSaveJob job;
  job.step_dir = step_dir;
  job.shard = WritesShard(m) ? m.rt.shard_rank : -1;
  job.shard_world = m.rt.shard_size();
  job.local = PrepareStepDir(m, step_dir, trainer_json);
  if (job.local.ok() && WritesShard(m)) {
    absl::StatusOr<ckpt::ShardSnapshot> snapshot = Snapshot(m, async_saver_->TakeSpareBuffers());
    if (snapshot.ok()) {
      job.snapshot = *std::move(snapshot);
    } else {
      job.local = snapshot.status();
    }
  }
  if (m.rt.rank() == 0 && job.local.ok()) job.manifest = BuildManifest(m, trainer_json);
  return async_saver_->Start(std::move(job));
}

Engine::SnapshotBytes Engine::checkpoint_snapshot_bytes() const {
  if (async_saver_ == nullptr) return {};
  const ckpt::SnapshotBytes b = async_saver_->last_snapshot();
  return {b.host, b.nvme, b.staging, b.in_place};
}

Engine::CloneCounts Engine::checkpoint_clones() const {
  if (async_saver_ == nullptr) return {};
  const ckpt::CloneCounts c = async_saver_->last_clones();
  return {c.tiles, c.checked_by_steps, c.read_back_bytes};
}

absl::Status Engine::WaitCheckpoint() { return async_saver_ == nullptr ? absl::OkStatus() : async_saver_->Wait(); }

bool Engine::checkpoint_in_flight() const { return async_saver_ != nullptr && async_saver_->in_flight(); }

}  // namespace strata::engine
