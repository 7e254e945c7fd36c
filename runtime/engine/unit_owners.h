// The engine's per-unit protocol and the variants its hooks delegate to (Note [Unit protocol], Note [Unit
// owners]). Not a public header: the engine's own files include it through engine_impl.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/engine/engine.h"
#include "runtime/optim/step.h"
#include "runtime/shard/grad_reducer.h"

namespace strata::engine {

struct UnitState;
struct PoolPlans;

// Note [Unit protocol]. Each unit checks its own transitions, as FSDP2's parameter group runs pre_forward,
// post_forward, pre_backward, post_backward and reshard. Within a micro-batch a unit has a number of forward
// uses f, of backward uses b, and of uses begun but not ended a (active):
//   pre_forward   (BeginForward in a micro-batch)  refused once b > 0; then f += 1
//   pre_backward  (BeginBackward)                  refused unless b < f; then b += 1
//   begin compute (either Begin, after the gather) a += 1
//   post_forward / post_backward (End*)            refused when a == 0; then a -= 1
//   last backward use                              b == f after post_backward: the gradient is complete
//   reshard                                        only when a == 0 (nothing computes on the parameters)
//   end of the micro-batch                         refused unless a == 0 and f == b; then f = b = 0
// A forward outside a micro-batch (evaluation) counts no use. The engine checks the micro-batch and the
// schedule (Note [Agreed schedule]); the unit, its own counts. The messages name the hook and the unit.
class UnitProtocol {
 public:
  void BeginMicroBatch() { forward_uses_ = backward_uses_ = 0; }
  absl::Status CheckPreForward(const std::string& unit) const;
  void CountForward() { ++forward_uses_; }
  absl::Status CheckPreBackward(const std::string& unit) const;
  void CountBackward() { ++backward_uses_; }
  void BeginCompute(int64_t now_ns) {
    ++active_;
    compute_start_ns_ = now_ns;
  }
  // post_forward / post_backward: when the compute began (the last Begin's time).
  absl::StatusOr<int64_t> PostForward(const std::string& unit);
  absl::StatusOr<int64_t> PostBackward(const std::string& unit);
  bool idle() const { return active_ == 0; }
  bool last_backward_use() const { return backward_uses_ == forward_uses_; }
  bool used_in_backward() const { return backward_uses_ > 0; }
  absl::Status CheckMicroBatchEnd(const std::string& unit) const;

 private:
  absl::StatusOr<int64_t> EndCompute();
  int active_ = 0;
  int forward_uses_ = 0;
  int backward_uses_ = 0;
  int64_t compute_start_ns_ = 0;
};

// Note [Unit owners]. What differs between the configurations the engine runs is an object chosen once at
// Finalize (engine_owners.cc), so that no hook and no step tests the stage, frozenness or
// strata.optimizer_in_backward:
//  - ParamsOwner, by stage: where a unit's parameters are for compute and what follows an update. Stage 3
//    gathers per use through the shard::Gatherer it owns (prefetch along the schedule, reshard after use)
//    and needs every rank's agreement for a forward outside a micro-batch; stages 1-2 hold them whole and
//    all-gather the updated slices after the step; stage 0 holds and updates them whole.
//  - GradOwner, per unit: a frozen unit takes no working buffer, no mark and no reduction (Note [Frozen
//    units]); a trained unit acquires its working gradient buffer and, after its last backward use of a
//    micro-batch the reducer reduces in, hands the unit to the UpdateOwner.
//  - UpdateOwner, by strata.optimizer_in_backward: after the step (reduce into the gradient shard; the step
//    runs optim::RunOptimizerStep over the trained units) or in backward (reduce, then update the unit
//    reduced before; the step finishes the last and the norm: Note [Optimizer in backward]).
//  - StateOwner, per unit (unit_storage.h, chosen in UnitStorage::SetUpState): a frozen unit's master is its
//    param storage and it has no other kind; a trained unit's kinds are the optim::StateStore's.
// Each holds the engine (the same layer: nothing below is called back) and reads it when it runs.
class ParamsOwner {
 public:
  virtual ~ParamsOwner() = default;
  // A forward outside a micro-batch (an evaluation): stage 3 agrees on it across ranks (Note [Agreed
  // schedule]).
  virtual absl::Status EvaluationUse(int unit) = 0;
  virtual absl::Status Issue(int unit) = 0;   // pre_forward / pre_backward: the unit's gather, unless in flight
  virtual void Prefetch(int unit) = 0;        // within a micro-batch: the next units along the schedule
  virtual absl::Status Ensure(int unit) = 0;  // the parameters are ready for compute
  virtual void Reshard(int unit) = 0;         // no compute uses the unit (UnitProtocol::idle)
  virtual char* Base(int unit) const = 0;     // where compute reads the full unit (null: not gathered)
  // After an update of `units` (in unit order): their parameters as the next forward reads them.
  virtual absl::Status AfterUpdate(const std::vector<int>& units) = 0;
  // GatherUnit: the whole unit's fp32 master from `mine`, this rank's update range of it (stage 0: the
  // unit itself; else an all-gather of the shard group's slices on the control stream).
  virtual absl::StatusOr<std::vector<float>> WholeMaster(int unit, std::vector<float> mine) = 0;
  virtual void Drain() {}  // the engine's destructor: work in flight on the owner's own streams
};

class GradOwner {
 public:
  virtual ~GradOwner() = default;
  virtual absl::Status PreBackward(int unit) = 0;
  // Where backward accumulates the unit's gradient (shard::GradReducer::working); null for a frozen unit.
  virtual float* Working(int unit) const = 0;
  // Note [Parameters without a gradient]: the trainer's mark for `param` in micro-batch `micro_batch`.
  virtual void MarkNoGrad(UnitState& u, int param, int micro_batch) = 0;
  virtual absl::Status LastBackwardUse(int unit) = 0;  // post_backward with b == f
};

class UpdateOwner {
 public:
  virtual ~UpdateOwner() = default;
  virtual absl::Status Reduce(int unit) = 0;  // the unit's gradient is complete for this step
  // With an update in backward pending (between the last backward and Step()), `what` is refused.
  virtual absl::Status CheckNoPendingUpdate(const char* what) const = 0;
  virtual bool update_pending() const = 0;
  // Note [Parameters without a gradient]: whether this step may leave out the parameters no rank wrote a
  // gradient to (`left_out`: some were).
  virtual absl::Status CheckLeftOut(bool left_out) const = 0;
  // The step's update of every trained unit (`trained`, in unit order), with the reductions finished.
  virtual absl::StatusOr<optim::StepOutcome> Update(const std::vector<int>& trained, const optim::StepInputs& in) = 0;
  // Time spent in updates outside Update() since the last call (the updates in backward), in ns.
  virtual int64_t TakeUpdateNs() { return 0; }
};

// The owners the engine's units use, made once at Finalize (engine_owners.cc), and the unit lists they are
// run over: every unit, and the trained ones (not frozen), in unit order.
struct UnitOwners {
  // Note [Unit owners]: every choice by stage, frozenness and strata.optimizer_in_backward, made once at
  // Finalize over the engine's units (engine_owners.cc); again if Finalize runs again after it failed.
  absl::Status SetUp(Engine::Impl& m, const PoolPlans& pools, size_t largest_trained_shard);

  std::unique_ptr<ParamsOwner> params;
  std::unique_ptr<GradOwner> frozen_grads, trained_grads;
  std::unique_ptr<UpdateOwner> update;
  std::vector<int> all, trained;
  // Where the step sums the gradient norm's local parts (optim::StepInputs::norm_comm): the shard group's
  // control communicator where each rank updates a slice (stages 1-3); null at stage 0, where every rank
  // holds the whole averaged gradient. Replicas of a shard group hold the same shards, so the group's sum
  // is the global one (engine_groups.cc).
  comm::Communicator* norm_comm = nullptr;
  // Gradient reduction on reduce_comm / reduce_stream (shard/grad_reducer.h): all-reduce at stages 0-1,
  // reduce-scatter of pooled working buffers at stages 2-3. Declared last, so it is destroyed first.
  std::unique_ptr<shard::GradReducer> reducer;
};

}  // namespace strata::engine
