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
#include "runtime/engine/unit_storage.h"
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
  GradOwner* grad = nullptr;    // frozen or trained (Note [Unit owners]), set at Finalize
  StateOwner* state = nullptr;  // its master and optimizer state, frozen or trained (unit_storage.h), likewise
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

// Note [Param groups] (runtime/optim/optimizer.cc): the distinct own (lr, weight decay) pairs of the
// registered parameters, numbered in registration order; [0] is the config's (neither set). Each update
// segment's Segment::group indexes it, and each step turns it into the update's optim::GroupHypers.
struct ParamGroups {
  struct OwnHyper {
    std::optional<double> lr, weight_decay;
  };
  std::vector<OwnHyper> groups{OwnHyper{}};
  int GroupOf(const shard::ParamSpec& spec);  // its index in groups, added when new (engine_step.cc)
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
  // The update segments of unit i in this step: its own unless SegmentsWithGrad left some out.
  const std::vector<shard::Segment>* SegmentsOf(size_t i, const std::vector<shard::Segment>& own) const {
    return i < step_segments_own.size() && step_segments_own[i] ? &step_segments[i] : &own;
  }
  // engine_step.cc. Note [Parameters without a gradient]: with strata.params_without_grad "skip", the
  // update segments of this step of the `trained` units (parameters no rank wrote a gradient to left out,
  // those that skipped earlier steps with their own step count) into step_segments, and whether any was
  // left out; one small all-reduce on `control`. Without the key nothing (the units' own segments).
  absl::StatusOr<bool> SegmentsWithGrad(std::vector<UnitState>& units, const std::vector<int>& trained,
                                        const EngineConfig& cfg, comm::Communicator& control,
                                        device::Stream& control_stream);
  // After an applied update: the left-out parameters skipped one more step.
  void CountSkippedSteps(std::vector<UnitState>& units) const;
  // The scheduler's lr for the next step of a parameter with own lr `own_lr` (unset: the config's group).
  double NextLr(const EngineConfig& cfg, std::optional<double> own_lr = std::nullopt) const;
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
// units and checks the hook protocol. Its members: what it runs on (rt), where it is in the protocol and
// what the step has cost (progress), the configuration, the units' storage (placement, parameter cache,
// optimizer state), the units, the schedule and the owners. Declared in this order, so the owners are
// destroyed first and the runtime last (every buffer, store and pool was made from its tiers).
//
// Note [Engine on CUDA]. On a CUDA device (EngineRuntime::SetUpCuda, engine_cuda.cc) the device tier is one
// cudaMalloc arena (created in Finalize: the device budget, or without one exactly what the model's state
// needs, so the rest of the GPU stays with the trainer; until then a host accountant checks the budget), the
// device tier ops are the kernels/cuda twins, gather / reduce / step run on NCCL communicators bootstrapped
// over the host world, and control collectives stay on a host communicator. The pinned-host tier is
// registered with CUDA. Optimizer offload needs stage >= 2 (reduced gradient shards are copied to the host
// through the reducer's staging, shard/grad_reducer.h); parameter offload also needs optimizer offload and
// gathers through Note [Staged gathers].
struct Engine::Impl {
  EngineRuntime rt;
  StepState progress;
  EngineConfig cfg;
  UnitStorage storage{rt, cfg};  // unit_storage.h
  std::vector<UnitState> units;
  ParamGroups param_groups;                   // Note [Param groups]
  std::unique_ptr<shard::Schedule> schedule;  // the recorded order of the units' first uses (prefetch)
  // Note [Unit owners] (unit_owners.h): the stage's parameter owner (at stage 3 with the gatherer: the
  // gathered buffers, the gather communicator and stream and where the shards come from), the frozen and
  // trained units' gradient owners, the update after the step or in backward, the gradient reducer, and the
  // unit lists they run over; made once in UnitOwners::SetUp (engine_owners.cc) at Finalize.
  UnitOwners owners;

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
  // Zeroes the gradient shards for the next step; with strata.release_idle_memory hands them and the
  // reducer's idle buffers back instead (Note [Idle pages]). The reductions must be finished.
  absl::Status ZeroGrads();
};

}  // namespace strata::engine
