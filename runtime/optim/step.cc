#include "runtime/optim/step.h"

#include <cmath>

#include "runtime/base/status.h"
#include "runtime/optim/optimizer.h"

namespace strata::optim {

absl::StatusOr<StepOutcome> RunOptimizerStep(StateStore& store, const OptimizerConfig& cfg, const GradOps& ops,
                                             const std::vector<StepUnit>& units, const StepInputs& in) {
  double local_sq = 0;
  for (const StepUnit& u : units) {
    STRATA_RETURN_IF_ERROR(ops.scale(u.grad, u.elems, in.grad_scale));
    STRATA_ASSIGN_OR_RETURN(const double sq, ops.sum_squares(u.grad, u.elems));
    local_sq += sq;
  }
  float total_sq = static_cast<float>(local_sq);  // what crosses the ranks is fp32
  if (in.sum_across_ranks) STRATA_RETURN_IF_ERROR(in.sum_across_ranks(&total_sq));
  StepOutcome out;
  out.grad_norm = std::sqrt(static_cast<double>(total_sq));
  if (!std::isfinite(out.grad_norm)) {
    out.skipped = true;
    return out;
  }
  out.clip_coef = ClipCoefficient(out.grad_norm, in.max_norm);
  // Units are independent here, so the order is free: last to first, so that with parameter shards on
  // NVMe the cache keeps the first units (the most recently written), which the next forward needs first.
  for (int unit = static_cast<int>(units.size()) - 1; unit >= 0; --unit) {
    const StepUnit& u = units[unit];
    const UnitStep up{u.grad, u.segments, u.params, in.param_dtype, in.lr, in.step, out.clip_coef, in.executor};
    STRATA_ASSIGN_OR_RETURN(const offload::TilePipelineStats s, store.Step(unit, cfg, up));
    out.io.tiles += s.tiles;
    out.io.compute_ns += s.compute_ns;
    out.io.read_wait_ns += s.read_wait_ns;
    out.io.write_wait_ns += s.write_wait_ns;
    out.io.bytes_read += s.bytes_read;
    out.io.bytes_written += s.bytes_written;
  }
  return out;
}

}  // namespace strata::optim
