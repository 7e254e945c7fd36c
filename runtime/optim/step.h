// The optimizer step over a StateStore (issue 16: optim/ owns the step): scale every unit's gradients,
// the global norm (the local sum of squares in unit order, then one sum across ranks), skip on a
// non-finite norm (the norm is global, so every rank decides the same), clip, and update every unit,
// last to first. What comes before (waiting for the reductions) and after (re-replicating the params,
// zeroing the gradients, the loss scale) stays with the caller, which owns those buffers.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/optim/state_store.h"

namespace strata::optim {

// One unit of the step: its gradients over the update range and where its params go.
struct StepUnit {
  float* grad = nullptr;
  size_t elems = 0;  // the update range
  const std::vector<shard::Segment>* segments = nullptr;
  ParamsAccess params;
  int unit = -1;  // the store's unit; -1: its position in the list (a caller that leaves units out names them)
};

struct StepInputs {
  float grad_scale = 1;  // multiplies every gradient first: 1 / (ranks x accumulation steps x loss scale)
  // Each param group's scheduled lr and decay for this update, by Segment::group; [0] is the config's
  // (Note [Param groups]).
  GroupHypers groups;
  int64_t step = 0;      // 1-based
  double max_norm = 0;   // gradient clipping (ClipCoefficient); 0 = off
  DType param_dtype = DType::kF32;
  HostExecutor* executor = nullptr;
  // The communicator the local sum of squares is summed across (fp32, in place), on norm_stream; null
  // where it is already global (every rank holds the whole averaged gradient). The wait is added to
  // *norm_wait_ns when that is set.
  comm::Communicator* norm_comm = nullptr;
  device::Stream* norm_stream = nullptr;
  int64_t* norm_wait_ns = nullptr;
};

struct StepOutcome {
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite norm: nothing was updated
  float clip_coef = 1;
  offload::TilePipelineStats io;  // summed over the units (NVMe state)
};

// The parts of the step, which RunOptimizerStep runs in order and the update in backward
// (strata.optimizer_in_backward) runs unit by unit as the gradients complete:
// ScaleAndSumSquares scales one unit's gradients (on `grads`, their tier: Note [Tier ops] in
// runtime/memory/tier_ops.h) and returns their local sum of squares;
absl::StatusOr<double> ScaleAndSumSquares(memory::TierOps& grads, const StepUnit& u, float grad_scale);
// GlobalNorm sums local_sq across ranks and sets grad_norm, skipped and clip_coef;
absl::Status GlobalNorm(double local_sq, const StepInputs& in, StepOutcome* out);
// UpdateUnit runs the store's step of one unit with clip_coef and adds its pipeline counters to `io`.
absl::Status UpdateUnit(StateStore& store, const OptimizerConfig& cfg, int unit, const StepUnit& u,
                        const StepInputs& in, float clip_coef, offload::TilePipelineStats* io);

absl::StatusOr<StepOutcome> RunOptimizerStep(StateStore& store, const OptimizerConfig& cfg, memory::TierOps& grads,
                                             const std::vector<StepUnit>& units, const StepInputs& in);

}  // namespace strata::optim
