// Engine lifecycle: creation, registration, the cross-rank registration check, allocation and
// initialisation of every unit's state, parameter views and whole-parameter gather / set.
#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/common/element_math.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/comm/agree.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/accounting.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/optimizer.h"

namespace strata::engine {

using memory::Kind;

namespace {

void StoreAs(DType dtype, float value, void* base, size_t index) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[index] = value; return;
    case DType::kBF16: static_cast<uint16_t*>(base)[index] = kernels::FloatToBf16(value); return;
    case DType::kF16: static_cast<uint16_t*>(base)[index] = kernels::FloatToHalf(value); return;
  }
}

// Writes the values of global elements [lo, hi) of the unit: `master` (fp32, may be null) and `params`
// (param dtype, may be null), each indexed from lo.
void InitRange(const UnitState& u, uint64_t seed, size_t lo, size_t hi, float* master, void* params, DType dtype) {
  for (const shard::ParamSlot& p : u.layout.params) {
    const uint64_t key = shard::ParamKey(u.layout.name, p.spec.name);
    const size_t b = std::max(lo, p.offset_elems), e = std::min(hi, p.offset_elems + p.numel);
    for (size_t j = b; j < e; ++j) {
      const float value = shard::InitValue(p.spec.init, seed, key, j - p.offset_elems);
      if (master != nullptr) master[j - lo] = value;
      if (params != nullptr) StoreAs(dtype, value, params, j - lo);
    }
  }
}

}  // namespace

#if !STRATA_WITH_CUDA
absl::Status EngineRuntime::SetUpCuda(const EngineConfig&, comm::Communicator&) {
  return absl::UnimplementedError("this build has no CUDA (STRATA_WITH_CUDA=OFF): use a host device");
}
absl::Status EngineRuntime::CreateDeviceArena(const EngineConfig&, uint64_t) { return absl::OkStatus(); }
#endif

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  async_saver_.reset();  // waits for the checkpoint in flight (Note [Asynchronous checkpoints])
  if (!impl_) return;
  // Drain the streams before buffers go away.
  if (impl_->owners.params != nullptr) impl_->owners.params->Drain();
  for (auto* s : {impl_->rt.gather_stream.get(), impl_->rt.reduce_stream.get(), impl_->rt.step_stream.get()}) {
    if (s != nullptr) s->Synchronize().IgnoreError();
  }
}

namespace {

// Note [One configuration] (config.h): every rank's JobWideFields, compared before anything else, so that
// ranks started with other settings (a flag on one rank, a config file that differs between nodes) fail
// alike on every rank naming the first differing key and each rank's value, instead of training on
// different numbers or dying in a mismatched collective. Two small all-gathers on the caller's
// communicator, whose deadline bounds them.
absl::Status AgreeOnConfig(const EngineConfig& cfg, comm::Communicator& world, device::Stream& stream) {
  return comm::AgreeOnFields(JobWideFields(cfg), "the engine configuration",
                             "Every rank must be started with the same configuration (the same config file and flags); "
                             "only memory budgets, optimizer threads, the collective timeout, release_idle_memory and "
                             "NVMe paths may differ per rank",
                             world, stream);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& given, comm::Communicator& world,
                                                       device::Device& device) {
  {  // Note [One configuration]: before any check that could fail on some ranks only
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream("config"));
    const absl::Status agreed = AgreeOnConfig(given, world, *stream);
    STRATA_RETURN_IF_ERROR(stream->Synchronize());
    STRATA_RETURN_IF_ERROR(agreed);
  }
  EngineConfig config = given;
  STRATA_RETURN_IF_ERROR(ResolveBatchSizes(world.size(), &config));  // Note [The batch triangle]
  if (world.rank() == 0) {  // once: what the config resolved to, and what it asked for in vain
    if (const std::string line = ResolvedAutoLine(config); !line.empty()) {
      STRATA_LOG(Info) << line;
    }
    for (const std::string& note : config.notes) STRATA_LOG(Info) << note;
  }
  if (config.reduce_dtype != DType::kF32) {
    return absl::UnimplementedError("strata.reduce_dtype other than fp32 is not implemented yet; use fp32");
  }
  if (config.offload_param.device != OffloadDevice::kNone && config.stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat("offload_param needs ZeRO stage 3 (stage is ", config.stage, ")"));
  }
  STRATA_RETURN_IF_ERROR(CheckOptimizerInBackward(config));
  // As the config parser refuses it (config.cc): stage 0 holds everything on every rank, so shard groups
  // would change nothing but which ranks write checkpoints.
  if (config.stage == 0 && config.shard_group_size != kShardGroupWorld && config.shard_group_size != world.size()) {
    return absl::InvalidArgumentError(
        "shard_group_size needs ZeRO stage 1, 2 or 3 (stage 0 shards nothing; leave it unset)");
  }
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->rt.world = &world;
  if (config.fp16.enabled) {
    const Fp16Config& f = config.fp16;
    impl->progress.loss_scaler = optim::LossScaler(
        f.static_loss_scale, {f.initial_scale_power, f.loss_scale_window, f.min_loss_scale, f.hysteresis,
                              f.consecutive_hysteresis});
  }
  impl->rt.device = &device;
  STRATA_ASSIGN_OR_RETURN(impl->rt.gather_stream, device.CreateStream("gather"));
  STRATA_ASSIGN_OR_RETURN(impl->rt.reduce_stream, device.CreateStream("reduce"));
  STRATA_ASSIGN_OR_RETURN(impl->rt.step_stream, device.CreateStream("step"));
  // On CUDA this host allocator only checks the device budget until Finalize creates the arena.
  impl->rt.device_alloc = std::make_unique<memory::HostAllocator>(memory::Tier::kDevice, config.device_budget_bytes,
                                                               &impl->rt.tracker);
  impl->rt.host_alloc = std::make_unique<memory::HostAllocator>(memory::Tier::kPinnedHost, config.host_budget_bytes,
                                                             &impl->rt.tracker);
  impl->storage.DecidePlace();
  // No pool where no update runs on the host (CUDA without optimizer offload: the device tier's kernels).
  const bool host_update =
      device.kind() != device::DeviceKind::kCuda || impl->storage.place.grads->tier() != memory::Tier::kDevice;
  STRATA_RETURN_IF_ERROR(impl->rt.SetOptimizerThreads(config, host_update ? config.optimizer_threads : 1));
  impl->rt.host_ops = memory::MakeHostTierOps(&impl->rt.host_threads);
  impl->rt.host_update = optim::MakeHostTierUpdate(&impl->rt.host_executor);
  STRATA_ASSIGN_OR_RETURN(impl->rt.groups, ResolveShardGroups(config, world, *impl->rt.step_stream));
  if (device.kind() == device::DeviceKind::kCuda) {  // Note [Engine on CUDA]
    STRATA_RETURN_IF_ERROR(impl->rt.SetUpCuda(config, world));
  } else {
    STRATA_RETURN_IF_ERROR(impl->rt.SetUpHostComms(config, world));  // engine_groups.cc
    impl->rt.device_ops = memory::MakeHostTierOps(&impl->rt.host_threads);
    impl->rt.device_update = optim::MakeHostTierUpdate(&impl->rt.host_executor);
  }
  impl->storage.DecidePlace();  // over the tiers SetUpCuda made
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

namespace {
// Note [Frozen units]: frozenness is per unit, so a unit's buffers either all exist or only its params do.
absl::Status CheckFrozenness(const std::string& unit, const std::vector<shard::ParamSpec>& params) {
  std::vector<std::string> frozen, trainable;
  for (const shard::ParamSpec& p : params) (p.frozen ? frozen : trainable).push_back(p.name);
  if (frozen.empty() || trainable.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unit '", unit, "' mixes frozen parameters (", absl::StrJoin(frozen, ", "), ") and trainable ones (",
      absl::StrJoin(trainable, ", "), "); a unit is frozen or trainable as a whole: register them as two units"));
}
}  // namespace

absl::StatusOr<int> Engine::RegisterUnit(std::string name, std::vector<shard::ParamSpec> params) {
  Impl& m = *impl_;
  if (m.progress.finalized) {
    return absl::FailedPreconditionError(absl::StrCat("RegisterUnit('", name, "') after Finalize()"));
  }
  for (const UnitState& u : m.units) {
    if (u.layout.name == name) return absl::InvalidArgumentError(absl::StrCat("unit '", name, "' registered twice"));
  }
  STRATA_RETURN_IF_ERROR(CheckFrozenness(name, params));
  STRATA_ASSIGN_OR_RETURN(shard::UnitLayout layout,
                          shard::UnitLayout::Build(std::move(name), std::move(params), m.rt.shard_size()));
  m.units.emplace_back();
  m.units.back().layout = std::move(layout);
  m.units.back().index = static_cast<int>(m.units.size()) - 1;
  m.units.back().ext = DecideExtents(m.cfg.stage, m.rt.shard_rank, m.units.back().layout);
  std::vector<int> groups;  // Note [Param groups]: numbered alike on every rank, whichever segments it holds
  for (const shard::ParamSlot& p : m.units.back().layout.params) groups.push_back(m.param_groups.GroupOf(p.spec));
  for (shard::Segment& s : m.units.back().ext.update_segments) s.group = groups[s.param];
  const size_t n = m.units.back().layout.params.size();  // Note [Parameters without a gradient]
  m.units.back().no_grad_micro_batches.assign(n, 0);
  m.units.back().no_grad_marked_in.assign(n, -1);
  m.units.back().skipped_steps.assign(n, 0);
  return static_cast<int>(m.units.size()) - 1;
}

namespace {

// Every rank gathers every rank's per-unit fingerprints; the first difference is reported on all ranks.
absl::Status CheckRegistrations(Engine::Impl& m) {
  const int n = m.rt.world_size();
  // Slot 0: unit count; then one fingerprint per unit, truncated to the shortest list.
  std::vector<uint64_t> mine(1 + m.units.size());
  mine[0] = m.units.size();
  for (size_t i = 0; i < m.units.size(); ++i) mine[1 + i] = m.units[i].layout.Fingerprint();
  std::vector<uint64_t> counts(n);
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(*m.rt.control, &mine[0], counts.data(), 8, *m.rt.control_stream).Wait());
  for (int r = 0; r < n; ++r) {
    if (counts[r] != mine[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "unit registrations differ across ranks: rank ", m.rt.rank(), " registered ", mine[0], " units but rank ", r,
          " registered ", counts[r], "; every rank must register the same units in the same order"));
    }
  }
  std::vector<uint64_t> all(n * mine.size());
  STRATA_RETURN_IF_ERROR(
      comm::AllGatherBytes(*m.rt.control, mine.data(), all.data(), 8 * mine.size(), *m.rt.control_stream).Wait());
  for (size_t i = 0; i < m.units.size(); ++i) {
    for (int r = 0; r < n; ++r) {
      if (all[r * mine.size() + 1 + i] != mine[1 + i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "unit registrations differ across ranks: unit #", i, " on rank ", m.rt.rank(), " is {",
            m.units[i].layout.Describe(), "} but rank ", r,
            " registered something else there (name, parameter names, shapes, weight-decay flags or own lr / weight "
            "decay differ)"));
      }
    }
  }
  return absl::OkStatus();
}

// Initial values of what the rank holds: its own range for stage 3, everything for the replicated stages.
absl::Status InitParams(Engine::Impl& m, UnitState& u) {
  const size_t lo = u.ext.param_begin, hi = lo + u.ext.param_elems;
  STRATA_ASSIGN_OR_RETURN(char* params,
                          m.storage.OpenParams(u, 0, u.ext.param_elems * m.storage.param_bytes(), /*keep=*/false));
  if (params == nullptr) return absl::OkStatus();
  InitRange(u, m.cfg.seed, lo, hi, nullptr, params, m.cfg.param_dtype);
  return m.storage.CloseParams(absl::OkStatus());
}

// `held` receives the unit's master and state buffers, which the StateStore takes over (SetUpState); a
// frozen unit's stay empty (Note [Frozen units]).
absl::Status AllocateUnit(Engine::Impl& m, UnitState& u, optim::MemoryUnit* held) {
  const Placement& at = m.storage.place;
  const size_t upd = u.ext.update_elems, param_bytes = u.ext.param_elems * m.storage.param_bytes();
  // A kind without a tier has no buffer in memory (Note [Placement]).
  auto allocate = [](memory::Allocator* tier, size_t bytes, Kind kind, memory::Buffer* b,
                     size_t alignment = 64) -> absl::Status {
    if (tier == nullptr) return absl::OkStatus();
    STRATA_ASSIGN_OR_RETURN(*b, tier->Allocate(bytes, kind, alignment));
    return absl::OkStatus();
  };
  STRATA_RETURN_IF_ERROR(allocate(at.params, param_bytes, Kind::kParamShard, &u.params));
  if (u.frozen()) return InitParams(m, u);  // the params alone
  STRATA_RETURN_IF_ERROR(allocate(at.master, upd * 4, Kind::kMaster, &held->master));
  STRATA_RETURN_IF_ERROR(allocate(at.grad_shards ? at.grads : nullptr, u.ext.grad_elems * 4, Kind::kGradShard, &u.grads,
                                  m.storage.GradAlignment(at.grads)));
  STRATA_RETURN_IF_ERROR(allocate(at.state, upd * 4, Kind::kOptimizerState, &held->m));
  if (optim::StateBuffers(m.cfg.optimizer) > 1) {
    STRATA_RETURN_IF_ERROR(allocate(at.state, upd * 4, Kind::kOptimizerState, &held->v));
  }
  held->master_ptr = m.storage.MasterPtr(u, held->master);
  held->elems = upd;
  return InitParams(m, u);
}

// The initial master, when it is not the param storage itself (allocators hand out zeroed memory;
// SetUpNvme zeroes the state on NVMe).
absl::Status InitMaster(Engine::Impl& m, UnitState& u) {
  if (!m.storage.separate_master() || u.frozen()) return absl::OkStatus();  // a frozen unit's master is its params
  const size_t upd = u.ext.update_elems;
  std::vector<float> values(upd, 0.0f);
  InitRange(u, m.cfg.seed, u.ext.update_begin, u.ext.update_begin + upd, values.data(), nullptr, DType::kF32);
  return u.state->Write(u, optim::StateKind::kMaster, values);
}

}  // namespace

namespace {
// The largest unit and shard, of all units and of the trained ones (frozen units have no gradient buffers:
// Note [Frozen units]).
struct LargestUnits {
  size_t shard = 0, trained_shard = 0;
};
}  // namespace

// Checks, before anything is allocated, that every tier's budget holds what Finalize will place there
// (Note [Tier placement]); the error names the tier, the need, the budget and the shortfall.
absl::Status CheckBudgets(Engine::Impl& m, uint64_t* device_need) {
  // Note [Memory accounting]: the bytes checked here are the ones `strata plan` reports.
  std::vector<shard::UnitLayout> layouts;
  std::vector<UnitExtents> extents;
  for (const UnitState& u : m.units) {
    layouts.push_back(u.layout);
    extents.push_back(u.ext);
  }
  const MemoryNeed plan =
      EngineMemoryNeed(m.cfg, layouts, extents, AccountingTarget{m.rt.device_ops->host_visible()});
  const uint64_t* need = plan.tier;
  std::string parts[memory::kNumTiers];
  for (const NeedItem& item : plan.items) {
    std::string& p = parts[static_cast<int>(item.tier)];
    absl::StrAppend(&p, p.empty() ? "" : ", ", item.what, " ", FormatBytes(item.bytes));
  }
  *device_need = need[static_cast<int>(memory::Tier::kDevice)];
  for (memory::Allocator* a : {m.rt.device_alloc.get(), m.rt.host_alloc.get()}) {
    const int t = static_cast<int>(a->tier());
    if (need[t] > a->free_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model does not fit: tier '", memory::TierName(a->tier()), "' needs ", FormatBytes(need[t]), " (",
          parts[t], ") but has ", FormatBytes(a->free_bytes()), " of its budget free: short by ",
          FormatBytes(need[t] - a->free_bytes()), " (", need[t] - a->free_bytes(),
          " bytes); offload (offload_param / offload_optimizer) or raise the budget"));
    }
  }
  return absl::OkStatus();
}

// Note [Param groups]: WarmupDecayLR, and WarmupLR given warmup_max_lr, give every parameter the schedule's
// peak, as DeepSpeed gives every param group the one warmup_max_lr; said once where that leaves a trained
// parameter's own lr unused.
void LogUnusedOwnLrs(const Engine::Impl& m) {
  if (!m.cfg.scheduler.shared_peak) return;
  int count = 0;
  std::string first;
  for (const UnitState& u : m.units) {
    if (u.frozen()) continue;
    for (const shard::ParamSlot& p : u.layout.params) {
      if (p.spec.own_lr.has_value() && count++ == 0) {
        first = absl::StrCat("'", u.layout.name, ".", p.spec.name, "' lr ", *p.spec.own_lr);
      }
    }
  }
  if (count == 0) return;
  const bool warmup_lr = m.cfg.scheduler.type == LrScheduleType::kWarmupLR;
  STRATA_LOG(Warning) << "scheduler " << (warmup_lr ? "WarmupLR" : "WarmupDecayLR")
                      << ": every parameter's lr rises to warmup_max_lr " << m.cfg.optimizer.lr
                      << ", as DeepSpeed gives every param group that one value; the own lr of " << count
                      << " parameter(s) (" << first << (count > 1 ? ", ..." : "") << ") is not used"
                      << (warmup_lr ? "; without scheduler.params.warmup_max_lr each param group's own lr is its "
                                      "peak, as in DeepSpeed"
                                    : "");
}

namespace {

// Note [NVMe room agreed]. Ranks that share a disk share its free space. Each NVMe store is preallocated (fallocate)
// when it is made, and the state's store wants twice the state: room for the tiles the steps write while an
// asynchronous save still holds the old ones (Note [Snapshots of NVMe state]), a speed, not a need. Taken in one
// go, the first rank to preallocate twice its state could leave a later rank (or this rank's own parameter store)
// without room for what it needs, on a disk with room for everyone's once: the job would fail, or not, by the
// order the ranks started in. So every rank first preallocates what it needs (the state once, the parameter
// shards; before them, the budget check and the device arena, which a rank may fail alone too); one all-gather
// of each rank's outcome follows, on every rank whatever its configuration, so a rank that could not reserve
// fails the others by name instead of leaving them in a later collective; only then does
// each rank grow its state's store to twice the state where the disk still has room (else a warning, and steps
// over a save wait for its writer: docs/decisions/0059-nvme-room-agreed.md).
absl::Status AgreeReserved(Engine::Impl& m, const absl::Status& reserved) {
  const int n = m.rt.world_size();
  const uint64_t mine = reserved.ok() ? 0 : 1;
  std::vector<uint64_t> all(n);
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(*m.rt.control, &mine, all.data(), 8, *m.rt.control_stream).Wait());
  STRATA_RETURN_IF_ERROR(reserved);
  for (int r = 0; r < n; ++r) {
    if (all[r] != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r,
                       " could not reserve its memory and NVMe stores (its own error names what it lacked: a "
                       "budget, the device, an NVMe path or its room); this rank reserved its own and stops with it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::Finalize() {
  Impl& m = *impl_;
  if (m.progress.finalized) return absl::FailedPreconditionError("Finalize() called twice");
  if (m.units.empty()) return absl::FailedPreconditionError("Finalize() with no registered unit");
  STRATA_RETURN_IF_ERROR(CheckRegistrations(m));
  if (m.rt.rank() == 0) LogUnusedOwnLrs(m);
  LargestUnits largest;
  std::vector<std::string> names;
  std::vector<size_t> unit_elems;
  std::vector<bool> frozen;
  for (UnitState& u : m.units) {
    largest.shard = std::max(largest.shard, u.layout.shard_elems);
    unit_elems.push_back(u.layout.total_elems);
    frozen.push_back(u.frozen());
    if (!u.frozen()) {
      largest.trained_shard = std::max(largest.trained_shard, u.layout.shard_elems);
    }
    names.push_back(u.layout.name);
  }
  const int live = LiveGatheredUnits(m.cfg, static_cast<int>(m.units.size()));
  // A tile larger than the largest update range would only make the staging buffers bigger.
  size_t largest_update = 0;
  for (const UnitState& u : m.units) {
    if (!u.frozen()) largest_update = std::max(largest_update, u.update_elems());
  }
  const size_t tile_elems = NvmeTileElems(m.cfg, largest_update);
  uint64_t device_need = 0;
  absl::Status reserved = CheckBudgets(m, &device_need);
  if (reserved.ok()) reserved = m.rt.CreateDeviceArena(m.cfg, device_need);
  if (reserved.ok()) {
    m.storage.DecidePlace();  // over the arena
    reserved = m.storage.ReserveNvme(m.units, tile_elems);
  }
  if (reserved.ok()) reserved = m.storage.SetUpNvmeParams(m.units, live, largest.shard);
  STRATA_RETURN_IF_ERROR(AgreeReserved(m, reserved));
  STRATA_RETURN_IF_ERROR(m.storage.SetUpNvme(m.units, tile_elems));
  std::vector<optim::MemoryUnit> held(m.units.size());
  for (size_t i = 0; i < m.units.size(); ++i) {
    UnitState& u = m.units[i];
    STRATA_RETURN_IF_ERROR(
        Annotate(AllocateUnit(m, u, &held[i]), absl::StrCat("allocating unit '", u.layout.name, "'")));
  }
  STRATA_RETURN_IF_ERROR(m.storage.SetUpState(m.units, std::move(held)));
  for (UnitState& u : m.units) {
    STRATA_RETURN_IF_ERROR(Annotate(InitMaster(m, u), absl::StrCat("allocating unit '", u.layout.name, "'")));
  }
  const PoolPlans pools = PlanPools(m.cfg, live, unit_elems, frozen);  // what CheckBudgets counted
  STRATA_RETURN_IF_ERROR(m.owners.SetUp(m, pools, largest.trained_shard));  // Note [Unit owners]
  // Note [Idle pages]: the gradient memory, zero-filled and so resident, is idle until the first backward.
  if (m.cfg.release_idle_memory) STRATA_RETURN_IF_ERROR(m.ZeroGrads());
  m.schedule = std::make_unique<shard::Schedule>(std::move(names));
  m.progress.finalized = true;
  return absl::OkStatus();
}

ParamView Engine::Param(int unit, int param) const {
  const Impl& m = *impl_;
  const UnitState& u = m.units[unit];
  const shard::ParamSlot& p = u.layout.params[param];
  // Where compute reads the full unit: the parameter owner's (Note [Unit owners]), the unit's own buffer
  // before Finalize.
  char* base = m.owners.params == nullptr ? u.params.as<char>() : m.owners.params->Base(unit);
  return ParamView{base == nullptr ? nullptr : base + p.offset_elems * m.storage.param_bytes(), m.cfg.param_dtype,
                   p.numel, &p.spec.shape};
}

float* Engine::Grad(int unit, int param) const {
  const Impl& m = *impl_;
  const UnitState& u = m.units[unit];
  float* working = u.grad == nullptr ? nullptr : u.grad->Working(unit);  // null before Finalize
  return working == nullptr ? nullptr : working + u.layout.params[param].offset_elems;
}

absl::StatusOr<std::vector<float>> Engine::GatherParam(int unit, int param) {
  STRATA_ASSIGN_OR_RETURN(std::vector<float> full, GatherUnit(unit));
  const shard::ParamSlot& p = impl_->units[unit].layout.params[param];
  return std::vector<float>(full.begin() + p.offset_elems, full.begin() + p.offset_elems + p.numel);
}

absl::StatusOr<std::vector<float>> Engine::GatherAllParams() {
  std::vector<float> all;
  for (int u = 0; u < num_units(); ++u) {
    STRATA_ASSIGN_OR_RETURN(std::vector<float> full, GatherUnit(u));
    for (const shard::ParamSlot& p : impl_->units[u].layout.params) {
      all.insert(all.end(), full.begin() + p.offset_elems, full.begin() + p.offset_elems + p.numel);
    }
  }
  return all;
}

absl::StatusOr<std::vector<float>> Engine::GatherUnit(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "GatherUnit"));
  STRATA_RETURN_IF_ERROR(m.owners.update->CheckNoPendingUpdate("GatherUnit"));
  UnitState& u = m.units[unit];
  STRATA_ASSIGN_OR_RETURN(std::vector<float> master, u.state->Read(u, optim::StateKind::kMaster));
  return m.owners.params->WholeMaster(unit, std::move(master));  // Note [Unit owners]: by stage
}

absl::Status Engine::SetParam(int unit, int param, const std::vector<float>& value) {
  STRATA_RETURN_IF_ERROR(impl_->CheckUnit(unit, "SetParam"));
  const shard::ParamSlot& p = impl_->units[unit].layout.params[param];
  if (value.size() != p.numel) {
    return absl::InvalidArgumentError(absl::StrCat("SetParam(", impl_->units[unit].layout.name, ".", p.spec.name,
                                                   "): ", value.size(), " values for ", p.numel, " elements"));
  }
  return SetParamRange(unit, param, 0, value.data(), value.size());
}

std::pair<size_t, size_t> Engine::HeldRange(int unit) const {
  const UnitState& u = impl_->units[unit];
  size_t lo = SIZE_MAX, hi = 0;
  for (auto [b, n] : {std::pair<size_t, size_t>{u.ext.update_begin, u.ext.update_elems},
                      std::pair<size_t, size_t>{u.ext.param_begin, u.ext.param_elems}}) {
    if (n == 0) continue;
    lo = std::min(lo, b);
    hi = std::max(hi, b + n);
  }
  return lo < hi ? std::pair<size_t, size_t>{lo, hi} : std::pair<size_t, size_t>{0, 0};
}

absl::Status Engine::SetParamRange(int unit, int param, size_t offset, const float* values, size_t count) {
  const ParamValues one{param, offset, values, count};
  return SetParamRanges(unit, absl::MakeConstSpan(&one, 1));
}

namespace {
// Whether the intervals [first, second) cover [lo, hi) without a gap (an empty [lo, hi) is covered).
bool Covers(std::vector<std::pair<size_t, size_t>> pieces, size_t lo, size_t hi) {
  std::sort(pieces.begin(), pieces.end());
  size_t reached = lo;
  for (const auto& [b, e] : pieces) {
    if (b > reached) break;
    reached = std::max(reached, e);
  }
  return reached >= hi;
}
}  // namespace

// Note [Unit-at-once writes]. SetParamRanges writes a unit's master and its parameter storage once for all the
// ranges it is given (docs/decisions/0043-unit-at-once-param-writes.md). Off the host tiers each of them is
// staged whole: the NVMe master tile by tile (StateStore::Read / Write), an NVMe parameter shard through the shard
// cache (written through whole), so writing a unit range by range moved the whole unit once per range. The master is
// read first only when the ranges leave part of its update range as it was; the parameter storage is opened
// over the ranges' cover, read first (keep) only when that cover has gaps. A frozen unit's master is its
// parameter storage (Note [Frozen units] in placement.h), which holds its update range, so the parameter write
// alone sets it.
absl::Status Engine::SetParamRanges(int unit, absl::Span<const ParamValues> ranges) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "SetParam"));
  STRATA_RETURN_IF_ERROR(m.owners.update->CheckNoPendingUpdate("SetParam"));
  UnitState& u = m.units[unit];
  // Note [Frozen units in a snapshot]: a save in flight may hold this unit's params in place.
  if (u.frozen() && async_saver_ != nullptr && async_saver_->last_snapshot().in_place > 0) async_saver_->Settle();
  // Each range's unit flat elements [a, a + count).
  std::vector<size_t> a(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ParamValues& r = ranges[i];
    if (r.param < 0 || static_cast<size_t>(r.param) >= u.layout.params.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("SetParam(", u.layout.name, "): parameter ", r.param, " of ", u.layout.params.size()));
    }
    const shard::ParamSlot& p = u.layout.params[r.param];
    if (r.offset > p.numel || r.count > p.numel - r.offset) {
      return absl::InvalidArgumentError(absl::StrCat("SetParam(", u.layout.name, ".", p.spec.name, "): elements [",
                                                     r.offset, ", ", r.offset + r.count, ") of ", p.numel));
    }
    a[i] = p.offset_elems + r.offset;
  }
  // The ranges' parts within [lo, hi), as intervals.
  auto within = [&](size_t lo, size_t hi) {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const size_t b = std::max(lo, a[i]), e = std::min(hi, a[i] + ranges[i].count);
      if (b < e) out.emplace_back(b, e);
    }
    return out;
  };
  // Master over the update range, then the param storage over what this rank holds.
  const size_t lo = u.update_begin(), hi = lo + u.update_elems();
  const std::vector<std::pair<size_t, size_t>> to_master = within(lo, hi);
  auto set_master = [&](float* master) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      const size_t z = a[i] + ranges[i].count;
      for (size_t j = std::max(lo, a[i]); j < std::min(hi, z); ++j) master[j - lo] = ranges[i].values[j - a[i]];
    }
  };
  if (!u.frozen() && !to_master.empty()) {
    if (Covers(to_master, lo, hi)) {  // every element is new: nothing to read
      std::vector<float> master(hi - lo);
      set_master(master.data());
      STRATA_RETURN_IF_ERROR(u.state->Write(u, optim::StateKind::kMaster, master));
    } else if (const auto lent = u.state->Lend(u, optim::StateKind::kMaster)) {  // in place
      set_master(lent->data());
    } else {  // staged: read, set, written back
      STRATA_ASSIGN_OR_RETURN(std::vector<float> master, u.state->Read(u, optim::StateKind::kMaster));
      set_master(master.data());
      STRATA_RETURN_IF_ERROR(u.state->Write(u, optim::StateKind::kMaster, master));
    }
  }
  // The given elements within what this rank holds, [b, e), from the storage's first element plo.
  const size_t plo = u.ext.param_begin, phi = plo + u.ext.param_elems;
  const std::vector<std::pair<size_t, size_t>> to_params = within(plo, phi);
  if (to_params.empty()) return absl::OkStatus();
  size_t b = phi, e = plo;
  for (const auto& [pb, pe] : to_params) {
    b = std::min(b, pb);
    e = std::max(e, pe);
  }
  STRATA_ASSIGN_OR_RETURN(
      char* params, m.storage.OpenParams(u, (b - plo) * m.storage.param_bytes(), (e - b) * m.storage.param_bytes(),
                                         /*keep=*/!Covers(to_params, b, e)));
  if (params == nullptr) return absl::OkStatus();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const size_t z = a[i] + ranges[i].count;
    for (size_t j = std::max(b, a[i]); j < std::min(e, z); ++j) {
      StoreAs(m.cfg.param_dtype, ranges[i].values[j - a[i]], params, j - b);
    }
  }
  return m.storage.CloseParams(absl::OkStatus());
}

absl::StatusOr<Engine::NvmeTraffic> Engine::nvme_traffic() {
  if (impl_->rt.io_queue == nullptr) return NvmeTraffic{};
  offload::ShardCache* cache = impl_->storage.pstore.param_cache.get();
  if (cache != nullptr) STRATA_RETURN_IF_ERROR(cache->Flush());
  const offload::IoQueueStats s = impl_->rt.io_queue->stats();
  return NvmeTraffic{s.bytes_read, s.bytes_written};
}

int Engine::num_units() const { return static_cast<int>(impl_->units.size()); }
const shard::UnitLayout& Engine::layout(int unit) const { return impl_->units[unit].layout; }
const EngineConfig& Engine::config() const { return impl_->cfg; }
int Engine::rank() const { return impl_->rt.rank(); }
int Engine::world_size() const { return impl_->rt.world_size(); }
int64_t Engine::step() const { return impl_->progress.step; }
float Engine::loss_scale() const { return impl_->progress.loss_scaler.scale(); }
double Engine::next_lr() const { return impl_->progress.NextLr(impl_->cfg); }
double Engine::next_lr(std::optional<double> own_lr) const { return impl_->progress.NextLr(impl_->cfg, own_lr); }
device::Timeline& Engine::timeline() { return impl_->progress.timeline; }
void Engine::ResetPeakMemory() { impl_->rt.tracker.ResetPeaks(); }

MemoryStats Engine::memory_stats() const {
  MemoryStats s;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    s.tier[t] = impl_->rt.tracker.tier(static_cast<memory::Tier>(t));
    for (int k = 0; k < memory::kNumKinds; ++k) {
      s.kind[t][k] = impl_->rt.tracker.kind(static_cast<memory::Tier>(t), static_cast<memory::Kind>(k));
    }
  }
  return s;
}

}  // namespace strata::engine
