// Internal state of the engine, shared by engine.cc (lifecycle), engine_hooks.cc (per-unit hooks,
// gathers, reductions) and engine_step.cc (the optimizer step). Not a public header.
//
// Storage per unit and stage (P = unit elements, S = P / G, the rank's slice of its shard group of G ranks,
// G = the world unless zero_optimization.shard_group_size says otherwise):
//   stage 0: params P (param dtype), grads P, master P*, state P      (* only when param dtype != fp32;
//   stage 1: params P,               grads P, master S*, state S        with fp32 params the master is
//   stage 2: params P,               grads S, master S*, state S        the param storage itself)
//   stage 3: params S,               grads S, master S*, state S,  plus pooled gathered / working buffers
//
// A frozen unit holds its params alone: Note [Frozen units] in placement.h.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/shard_groups.h"
#include "runtime/device/timeline.h"
#include "runtime/engine/accounting.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_runtime.h"
#include "runtime/engine/placement.h"
#include "runtime/engine/unit_owners.h"
#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/offload/io_queue.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"
#include "runtime/offload/shard_cache.h"
#include "runtime/optim/loss_scale.h"
#include "runtime/optim/memory_state.h"
#include "runtime/optim/state_kind.h"
#include "runtime/optim/state_store.h"
#include "runtime/optim/step.h"
#include "runtime/optim/tier_update.h"
#include "runtime/shard/gatherer.h"
#include "runtime/shard/grad_reducer.h"
#include "runtime/shard/param_storage.h"
#include "runtime/shard/schedule.h"
#include "runtime/shard/slot_pool.h"

namespace strata::engine {

struct UnitState {
  shard::UnitLayout layout;
  memory::Buffer params;  // param dtype
  memory::Buffer grads;   // fp32 (the master and the optimizer state are the StateStore's)
  UnitExtents ext;  // what the rank holds of each buffer (Note [Placement]), decided at RegisterUnit
  bool frozen() const { return ext.frozen; }  // Note [Frozen units]
  int index = 0;                              // its place among the engine's units (RegisterUnit)
  // The element range this rank updates, [update_begin, update_begin + update_elems), and where it starts
  // in the fp32 gradients.
  size_t update_begin() const { return ext.update_begin; }
  size_t update_elems() const { return ext.update_elems; }
  float* GradUpdatePtr() const { return grads.as<float>() + (ext.update_begin - ext.grad_begin); }

  // Where the unit is in the hook protocol (Note [Unit protocol]); the gathered and working gradient
  // buffers are the ParamsOwner's and the GradReducer's.
  UnitProtocol protocol;
  GradOwner* grad = nullptr;  // frozen or trained (Note [Unit owners]), set at Finalize
  // Note [Parameters without a gradient]: per parameter, the micro-batches of this step in which this rank
  // wrote it no gradient (MarkNoGrad; the micro-batch last marked, to count each once), and the steps whose
  // update skipped it (checkpointed).
  std::vector<int> no_grad_micro_batches;
  std::vector<int> no_grad_marked_in;
  std::vector<int64_t> skipped_steps;
};

// For errors about ranks that disagree (Note [Agreed schedule], Note [One configuration]).
using comm::RanksByValue;
using comm::RanksText;

// The rank's parameter storage beside the units' own buffers: with offload_param = nvme the shards in an
// NVMe store behind a cache of pinned buffers (Note [NVMe params]; all null otherwise), and the host
// access to a range of it (shard/param_storage.h), which ParamStorage and the step's updates open.
struct ParamStore {
  std::unique_ptr<offload::NvmeStore> param_store;
  std::unique_ptr<offload::PinnedPool> param_buffers;
  std::unique_ptr<offload::ShardCache> param_cache;
  offload::ShardCacheStats param_io_mark;  // cache counters when the last step ended
  shard::ParamStorage param_access;        // holds the host copy of device parameters, reused
};

// Where the engine is in its protocol (registration, micro-batches, steps, a failed hook), the loss
// scale, and what the current step has cost (reset when Step() returns).
struct StepState {
  bool finalized = false;
  bool in_micro_batch = false;
  int micro_batch = 0;  // micro-batches completed in this step
  int64_t step = 0;
  optim::LossScaler loss_scaler;  // fp16 (static or dynamic); scale 1 without fp16
  std::string failed;   // set after a failed hook: the engine refuses further hooks
  // Time accounting of the current step, in ns, and the NVMe bytes of the tiled update.
  int64_t compute_ns = 0, exposed_comm_ns = 0, exposed_io_ns = 0;
  uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  device::Timeline timeline;  // the spans of every step (Engine::timeline())
  // Note [Parameters without a gradient]: this step's update segments per unit (empty: the unit's own) and,
  // per unit and parameter, whether some rank wrote it a gradient.
  std::vector<std::vector<shard::Segment>> step_segments;
  std::vector<char> step_segments_own;  // per unit: step_segments replaces the unit's own segments
  std::vector<std::vector<char>> had_grad;
  // Runs `wait` on the trainer's thread and charges its duration to `counter` (exposed communication
  // unless said otherwise).
  template <typename F>
  absl::Status TimedWait(int64_t& counter, F&& wait) {
    const int64_t t0 = device::NowNs();
    absl::Status s = wait();
    counter += device::NowNs() - t0;
    return s;
  }
  template <typename F>
  absl::Status TimedWait(F&& wait) {
    return TimedWait(exposed_comm_ns, std::forward<F>(wait));
  }
};

// The engine composes the phase owners (shard::Gatherer, shard::GradReducer, optim::StateStore) over its
// units and checks the hook protocol. Its members: what it runs on (rt), the NVMe parameter cache
// (pstore), where it is in the protocol and what the step has cost (progress), the configuration and its
// placement, the units, the schedule and the three owners. Declared in this order, so the owners are
// destroyed first and the runtime last (every buffer, store and pool was made from its tiers).
struct Engine::Impl {
  EngineRuntime rt;
  ParamStore pstore;
  StepState progress;
  EngineConfig cfg;
  // Note [Engine on CUDA]. On a CUDA device (EngineRuntime::SetUpCuda, engine_cuda.cc) the device tier is one
  // cudaMalloc arena (created in Finalize: the device budget, or without one exactly what the model's state needs, so
  // the rest of the GPU stays with the trainer; until then a host accountant checks the budget), the
  // device tier ops are the kernels/cuda twins, gather / reduce / step run on NCCL communicators
  // bootstrapped over the host world, and control collectives stay on a host communicator. The
  // pinned-host tier is registered with CUDA. Optimizer offload needs stage >= 2 (reduced gradient
  // shards are copied to the host through the reducer's staging, shard/grad_reducer.h); parameter
  // offload also needs optimizer offload and gathers through Note [Staged gathers].

  // Note [Tier placement] and Note [Placement] (placement.h): which tier each buffer lives on.
  Placement place;  // decided once, in Create (Note [Placement])
  // Decides `place` over the current tiers, whose pointers it holds; again whenever a tier is replaced
  // (on CUDA, SetUpCuda replaces the pinned-host tier and CreateDeviceArena the device tier).
  void DecidePlace() { place = DecidePlacement(cfg, rt.device_alloc.get(), rt.host_alloc.get()); }
  bool separate_master() const { return place.master_apart; }
  memory::Allocator& ParamTier() const {
    return cfg.offload_param.device == OffloadDevice::kNone ? *rt.device_alloc : *rt.host_alloc;
  }
  // offload_optimizer = nvme: the master and state in tiles on NVMe (Note [NVMe state] in
  // optim/nvme_state.h).
  bool nvme_optimizer() const { return cfg.offload_optimizer.device == OffloadDevice::kNvme; }
  // The fp32 master and the optimizer state of every unit, wherever they live (optim/state_store.h):
  // optim::MemoryState (device or pinned-host buffers) or optim::NvmeState (the store, the staging tiles
  // and every unit's lanes), picked once in SetUpState from place.state.
  std::unique_ptr<optim::StateStore> state;
  // engine_nvme.cc, at Finalize after the units' buffers: `held` are their master / state buffers.
  absl::Status SetUpState(std::vector<optim::MemoryUnit> held);
  absl::Status SetUpNvme(size_t tile_elems);  // before the units' buffers; nothing without NVMe state
  // One kind (optim::StateKind) of a unit's optimizer state over its update range, as a host vector,
  // wherever it lives (device, pinned host or NVMe tiles). What export, SetParam, checkpoints and
  // initialisation use; never on the step's hot path.
  // A frozen unit's master is its param storage (Note [Frozen units]; engine_nvme.cc).
  absl::StatusOr<std::vector<float>> ReadState(UnitState& u, optim::StateKind kind) {
    if (u.frozen()) return ReadFrozen(u, kind);
    return state->Read(u.index, kind);
  }
  absl::Status WriteState(UnitState& u, optim::StateKind kind, const std::vector<float>& values) {
    if (u.frozen()) return WriteFrozen(u, kind, values);
    return state->Write(u.index, kind, values);
  }
  // Runs fn on the kind over the update range: in place where the CPU can reach it, else on a staged copy
  // (written back when write_back).
  absl::Status EditState(UnitState& u, optim::StateKind kind, const std::function<void(float*)>& fn,
                         bool write_back);  // engine_nvme.cc
  // The kinds this run's optimizer keeps, master first (optim::StateKinds).
  std::vector<optim::StateKind> state_kinds() const { return optim::StateKinds(cfg.optimizer.type); }
  // The kinds unit u keeps: the master alone for a frozen unit (Note [Frozen units]).
  std::vector<optim::StateKind> state_kinds(const UnitState& u) const {
    return u.frozen() ? std::vector<optim::StateKind>{optim::StateKind::kMaster} : state_kinds();
  }
  // A frozen unit's "master": its param storage over the update range, as fp32 (engine_nvme.cc); it has
  // no other kind.
  absl::StatusOr<std::vector<float>> ReadFrozen(UnitState& u, optim::StateKind kind);
  absl::Status WriteFrozen(UnitState& u, optim::StateKind kind, const std::vector<float>& values);
  // offload_param = nvme: parameter shards on NVMe behind a pinned cache (Note [NVMe params] in
  // shard/param_source.h); the fp32 master is then always a separate buffer (separate_master()).
  bool nvme_params() const { return cfg.offload_param.device == OffloadDevice::kNvme; }
  absl::Status SetUpNvmeParams(int live, size_t largest_shard);  // engine_nvme.cc; nothing without NVMe params
  // Runs fn(p) with p = bytes [offset, offset + bytes) of the rank's parameter storage (what u.params
  // holds: the shard at stage 3, the whole unit otherwise), in host memory: in place where the CPU reaches
  // it, else a host copy written back (device memory: only that range; NVMe: through the cache). keep =
  // false: fn overwrites the whole range, so it is not read first.
  absl::Status ParamStorage(UnitState& u, size_t offset, size_t bytes, const std::function<absl::Status(char* p)>& fn,
                            bool keep);
  // That range as the parameter storage opens it (shard/param_storage.h).
  shard::ParamRange ParamRangeOf(UnitState& u, size_t offset, size_t bytes) const;
  // Where this rank's update range starts in its parameter storage, in bytes.
  size_t UpdateParamOffset(const UnitState& u) const {
    return (u.ext.update_begin - u.ext.param_begin) * param_bytes();
  }
  // ParamStorage over this rank's update range, which fn overwrites whole (the step's update and casts).
  absl::Status UpdateParamStorage(UnitState& u, const std::function<absl::Status(char* p)>& fn) {
    return ParamStorage(u, UpdateParamOffset(u), u.update_elems() * param_bytes(), fn, /*keep=*/false);
  }
  // offload_param (cpu or nvme) under a device-buffer communicator: Note [Staged gathers] in
  // shard/param_source.h.
  memory::Allocator& OptimizerTier() const { return *place.grads; }  // the gradients live with the optimizer
  memory::TierOps& ParamOps() const { return rt.OpsOf(ParamTier()); }
  memory::TierOps& OptimizerOps() const { return rt.OpsOf(OptimizerTier()); }
  memory::TierOps& MasterOps() const { return separate_master() ? OptimizerOps() : ParamOps(); }
  optim::TierUpdate& OptimizerUpdate() const { return rt.UpdateOf(OptimizerTier()); }
  std::vector<UnitState> units;
  // Note [Param groups] (runtime/optim/optimizer.cc): the distinct own (lr, weight decay) pairs of the
  // registered parameters, numbered in registration order; [0] is the config's (neither set). Each update
  // segment's Segment::group indexes it, and each step turns it into the update's optim::GroupHypers.
  struct OwnHyper {
    std::optional<double> lr, weight_decay;
  };
  std::vector<OwnHyper> param_groups{OwnHyper{}};
  int GroupOf(const shard::ParamSpec& spec);  // its index in param_groups, added when new
  std::unique_ptr<shard::Schedule> schedule;  // the recorded order of the units' first uses (prefetch)
  // Note [Unit owners] (unit_owners.h): the stage's parameter owner (at stage 3 with the gatherer: the
  // gathered buffers, the gather communicator and stream and where the shards come from), the frozen and
  // trained units' gradient owners, the update after the step or in backward, and the unit lists they run
  // over; made once in SetUpOwners (engine_owners.cc) with the reducer.
  UnitOwners owners;
  // Gradient reduction on reduce_comm / reduce_stream (shard/grad_reducer.h): all-reduce at stages 0-1,
  // reduce-scatter of pooled working buffers at stages 2-3, picked once in SetUpOwners.
  std::unique_ptr<shard::GradReducer> reducer;
  absl::Status SetUpOwners(const PoolPlans& pools, size_t largest_trained_shard);  // engine_owners.cc
  // Only at stages 2-3 on CUDA: SetUpCuda refuses optimizer offload below stage 2.
  bool GradStagingNeeded() const {
    return !rt.device_ops->host_visible() && place.grads->tier() != memory::Tier::kDevice;
  }

  size_t param_bytes() const { return DTypeBytes(cfg.param_dtype); }
  // The gradient memory's alignment on `tier`: 2 MiB with strata.release_idle_memory where the tier hands
  // pages back, so the pages faulted in again after each step are huge pages (Note [Huge pages],
  // runtime/offload/pinned_pool.cc; Note [Idle pages]); 64 otherwise (a device arena is sized to the byte).
  size_t GradAlignment(const memory::Allocator* tier) const {
    return cfg.release_idle_memory && tier != nullptr && tier->hands_back_pages() ? size_t{2} << 20 : 64;
  }
  float* MasterPtr(UnitState& u, const memory::Buffer& master) const;  // update range of the fp32 master

  // engine_hooks.cc
  absl::Status CheckUnit(int unit, const char* hook) const;
  // A failure after state may have changed: the engine refuses every later hook with the first cause, and
  // its peers are told (Note [Failure notices]: every communicator the engine owns) so that they fail at
  // once instead of waiting at their deadline for collectives this rank will not issue. A failure that is
  // itself a peer's notice is passed on to no one.
  void Poison(const absl::Status& cause);
  // Note [Agreed schedule]: the use this rank is about to make (`what`: kForward / kBackward of `unit`, or
  // the end of the micro-batch with unit -1), compared across ranks before any collective is issued for it.
  absl::Status AgreeOnUse(int what, int unit);

  // engine_step.cc
  absl::StatusOr<StepResult> RunStep();
  optim::StepInputs StepInputsNow();  // the step's scalars (scale, lr, step, clip) and the norm's sum
  // The scheduler's lr for the next step of a parameter with own lr `own_lr` (unset: the config's group).
  double NextLr(std::optional<double> own_lr = std::nullopt) const;
  optim::StepUnit StepUnitOf(UnitState& u, float* grad);  // grad: the update range of the gradients
  // Note [Parameters without a gradient]: with strata.params_without_grad "skip", the units' update
  // segments of this step (parameters no rank wrote a gradient to left out, those that skipped earlier
  // steps with their own step count) into progress.step_segments, and whether any was left out; one small
  // all-reduce. Without the key nothing (the units' own segments).
  absl::StatusOr<bool> SegmentsWithGrad();
  void CountSkippedSteps();  // after an applied update: the left-out parameters skipped one more step
  // The param storage over the update range from `master` (host memory, the update range of the fp32
  // master); nothing when the master is the param storage itself.
  absl::Status CastMasterToParams(UnitState& u, const float* master);
  // Zeroes the gradient shards for the next step; with strata.release_idle_memory hands them and the
  // reducer's idle buffers back instead (Note [Idle pages]). The reductions must be finished.
  absl::Status ZeroGrads();
};

}  // namespace strata::engine
