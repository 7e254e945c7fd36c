// Loading a checkpoint at any world size and stage. Each rank needs its update range of every unit
// (its slice, or everything at stage 0); it finds the saved shards whose slices overlap, reads those
// ranges (each verified against its checksum) and copies the overlap. The saved slice size follows from
// the manifest's units laid out at the saved world size, so only the overlapping shards are opened.
// The manifest and shards are read through checkpoint/consolidate.h (validated, confined to the step
// directory) and the range arithmetic is checkpoint/reshard.h's ReadResharded; each saved shard must hold
// the whole of its part of the range, or loading is DataLoss.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/checkpoint/shard_file.h"
#include "runtime/engine/engine_impl.h"

namespace strata::engine {

namespace ckpt = checkpoint;

namespace {

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// A parameter's own lr or weight decay (Note [Param groups]) against the checkpoint's, where an unset value is
// this run's config value (`config`): a checkpoint without own values loads into a run whose param group
// states the config's value, and the other way round. A changed config value alone (both unset) is the run's
// choice, as it always was. "" when the values agree, else what differs.
std::string OwnHyperDiffers(const std::optional<double>& there, const std::optional<double>& here, double config,
                            const char* what) {
  const double a = there.value_or(config), b = here.value_or(config);
  if (a == b) return "";
  const bool close = absl::StrCat(a) == absl::StrCat(b);  // six digits, unless the two print alike then
  auto text = [&](double v) { return close ? absl::StrFormat("%.17g", v) : absl::StrCat(v); };
  if (here && there)
    return absl::StrCat("has its own ", what, " ", text(b), " here but ", text(a), " in the checkpoint");
  if (here) {
    return absl::StrCat("has its own ", what, " ", text(b), " here but none in the checkpoint (the config's, ", text(a),
                        " in this run)");
  }
  return absl::StrCat("takes the config's ", what, " ", text(b), " here but had its own ", text(a),
                      " in the checkpoint");
}

absl::Status CheckSameModel(const Engine::Impl& m, const ckpt::Manifest& man, const std::string& dir) {
  auto differ = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "' holds a different model: ", what));
  };
  // The same model, trained with other per-parameter optimizer settings (the trainer's param groups).
  auto differ_hyper = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "' was saved with other optimizer settings for this model: ", what));
  };
  if (man.units.size() != m.units.size()) {
    return differ(absl::StrCat(man.units.size(), " units there, ", m.units.size(), " here"));
  }
  for (size_t i = 0; i < m.units.size(); ++i) {
    const auto& here = m.units[i].layout;
    const auto& there = man.units[i];
    if (there.name != here.name)
      return differ(absl::StrCat("unit #", i, " is '", there.name, "' there, '", here.name, "' here"));
    if (there.params.size() != here.params.size()) {
      return differ(absl::StrCat("unit '", here.name, "' has ", there.params.size(), " parameters there, ",
                                 here.params.size(), " here"));
    }
    for (size_t p = 0; p < here.params.size(); ++p) {
      const auto& a = there.params[p];
      const auto& b = here.params[p];
      if (a.name != b.spec.name || a.shape != b.spec.shape) {
        return differ(absl::StrCat("parameter '", here.name, ".", b.spec.name, "' ", Shape(b.spec.shape),
                                   " here is '", there.name, ".", a.name, "' ", Shape(a.shape), " there"));
      }
      if (a.weight_decay != b.spec.weight_decay) {  // the trainer's choice (param groups, weight_decay=)
        return differ_hyper(absl::StrCat("parameter '", here.name, ".", b.spec.name, "' ",
                                         b.spec.weight_decay ? "decays" : "does not decay", " here but ",
                                         a.weight_decay ? "decayed" : "did not decay",
                                         " in the checkpoint (its weight-decay flag: give it the same param group "
                                         "or weight_decay choice as the run that saved it)"));
      }
      // The param group's own lr and weight decay (Note [Param groups]), also the trainer's choice.
      // Frozen parameters and those that do not decay have nothing to compare.
      const bool trained = !a.frozen && !b.spec.frozen;
      for (const std::string& own :
           {trained ? OwnHyperDiffers(a.own_lr, b.spec.own_lr, m.cfg.optimizer.lr, "lr") : std::string(),
            trained && a.weight_decay ? OwnHyperDiffers(a.own_weight_decay, b.spec.own_weight_decay,
                                                        m.cfg.optimizer.weight_decay, "weight decay")
                                      : std::string()}) {
        if (own.empty()) continue;
        return differ_hyper(absl::StrCat("parameter '", here.name, ".", b.spec.name, "' ", own,
                                         ": give it the same param group (lr, weight_decay) as the run that "
                                         "saved it"));
      }
      if (a.frozen != b.spec.frozen) {  // the saved kinds differ (Note [Frozen units])
        return differ(absl::StrCat("parameter '", here.name, ".", b.spec.name, "' is ",
                                   b.spec.frozen ? "frozen" : "trainable", " here but was saved ",
                                   a.frozen ? "frozen" : "trainable"));
      }
    }
  }
  if (man.param_dtype != DTypeName(m.cfg.param_dtype)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint '", dir, "' was written with param dtype ",
                                                      man.param_dtype, "; this run uses ",
                                                      DTypeName(m.cfg.param_dtype)));
  }
  const std::string opt = m.cfg.optimizer.type == OptimizerType::kAdamW ? "adamw" : "sgd";
  if (man.optimizer != opt) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint '", dir, "' holds ", man.optimizer,
                                                      " state; this run uses ", opt));
  }
  return absl::OkStatus();
}

absl::Status RestoreUnit(Engine::Impl& m, UnitState& u, const ckpt::ManifestUnit& saved, int saved_world,
                         ckpt::ShardReaders& shards) {
  std::vector<shard::ParamSpec> specs;
  for (const auto& p : saved.params) specs.push_back({p.name, p.shape, p.weight_decay});
  STRATA_ASSIGN_OR_RETURN(shard::UnitLayout old, shard::UnitLayout::Build(saved.name, specs, saved_world));
  const size_t lo = u.update_begin(), hi = lo + u.update_elems();
  const std::vector<optim::StateKind> kinds = u.state->kinds();  // the master alone when frozen
  // Each kind is filled into a host copy of this unit's update range, then written to wherever it lives
  // (StateOwner::Write: device, pinned host or NVMe tiles).
  std::vector<std::vector<float>> staged(kinds.size(), std::vector<float>(u.update_elems(), 0.0f));
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (const shard::ParamSlot& p : u.layout.params) {
      const size_t b = std::max(lo, p.offset_elems), e = std::min(hi, p.offset_elems + p.numel);
      if (b < e) {
        STRATA_RETURN_IF_ERROR(ckpt::ReadResharded(shards, u.layout.name, p.spec.name,
                                                   std::string(optim::StateKindName(kinds[k])), b, e,
                                                   old.shard_elems, staged[k].data() + (b - lo)));
      }
    }
    STRATA_RETURN_IF_ERROR(u.state->Write(u, kinds[k], staged[k]));
  }
  // A frozen unit's master is its params, written above (Note [Frozen units]): nothing to cast then.
  return u.state->MasterToParams(u, staged[0].data());
}

absl::Status LoadLocal(Engine::Impl& m, const std::string& step_dir, ckpt::Manifest* man) {
  STRATA_ASSIGN_OR_RETURN(*man, ckpt::ReadManifest(step_dir));
  STRATA_RETURN_IF_ERROR(CheckSameModel(m, *man, step_dir));
  ckpt::ShardReaders shards(*man, step_dir);
  for (size_t i = 0; i < m.units.size(); ++i) {
    STRATA_RETURN_IF_ERROR(RestoreUnit(m, m.units[i], man->units[i], man->world_size, shards));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> Engine::LoadCheckpoint(const std::string& step_dir) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "LoadCheckpoint"));
  if (async_saver_ != nullptr) STRATA_RETURN_IF_ERROR(async_saver_->Drain());  // Note [Asynchronous checkpoints]
  if (m.progress.in_micro_batch || m.progress.micro_batch != 0) {
    return absl::FailedPreconditionError("LoadCheckpoint() inside a step; call it before training");
  }
  ckpt::Manifest man;
  absl::Status local = LoadLocal(m, step_dir, &man);
  // Every rank reads different shards, so one may fail where others succeed: agree before going on, or
  // the ranks that succeeded would wait in their next collective for the one that returned.
  std::vector<float> ok(m.rt.world_size()), mine(1, local.ok() ? 1.0f : 0.0f);
  STRATA_RETURN_IF_ERROR(
      m.rt.control->AllGather(mine.data(), ok.data(), 1, DType::kF32, *m.rt.control_stream).Wait());
  std::vector<int> failed;
  for (int r = 0; r < m.rt.world_size(); ++r) {
    if (ok[r] == 0) failed.push_back(r);
  }
  if (!local.ok()) return local;
  if (!failed.empty()) {
    return absl::DataLossError(absl::StrCat("loading checkpoint '", step_dir, "' failed on rank(s) ",
                                            absl::StrJoin(failed, ","), " (see their errors)"));
  }
  // Every unit, frozen ones too: the loaded values replace whatever each rank held.
  STRATA_RETURN_IF_ERROR(m.owners.params->AfterUpdate(m.owners.all));
  STRATA_RETURN_IF_ERROR(m.ZeroGrads());
  m.progress.step = man.step;
  for (size_t i = 0; i < m.units.size(); ++i) {  // Note [Parameters without a gradient]
    for (size_t p = 0; p < m.units[i].skipped_steps.size(); ++p) {
      m.units[i].skipped_steps[p] = std::min(man.units[i].params[p].skipped_steps, man.step);
    }
  }
  m.progress.loss_scaler.Restore(man.loss_scale, man.clean_steps,
                                 man.loss_scale_hysteresis > 0 ? man.loss_scale_hysteresis : m.cfg.fp16.hysteresis);
  return man.trainer_json;
}

}  // namespace strata::engine
