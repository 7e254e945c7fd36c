#include "runtime/optim/step.h"

#include <cmath>

#include "runtime/base/status.h"
#include "runtime/optim/optimizer.h"

namespace strata::optim {

absl::StatusOr<double> ScaleAndSumSquares(memory::TierOps& grads, const StepUnit& u, float grad_scale) {
  STRATA_RETURN_IF_ERROR(grads.Scale(u.grad, u.elems, grad_scale));
  return grads.SumSquares(u.grad, u.elems);
}

absl::Status GlobalNorm(double local_sq, const StepInputs& in, StepOutcome* out) {
  float total_sq = static_cast<float>(local_sq);  // what crosses the ranks is fp32
  if (in.norm_comm != nullptr) {
    const int64_t t0 = device::NowNs();
    const absl::Status s =
        in.norm_comm->AllReduce(&total_sq, &total_sq, 1, DType::kF32, comm::ReduceOp::kSum, *in.norm_stream).Wait();
    if (in.norm_wait_ns != nullptr) *in.norm_wait_ns += device::NowNs() - t0;
    STRATA_RETURN_IF_ERROR(s);
  }
  out->grad_norm = std::sqrt(static_cast<double>(total_sq));
  out->skipped = !std::isfinite(out->grad_norm);
  if (!out->skipped) out->clip_coef = ClipCoefficient(out->grad_norm, in.max_norm);
  return absl::OkStatus();
}

absl::Status UpdateUnit(StateStore& store, const OptimizerConfig& cfg, int unit, const StepUnit& u,
                        const StepInputs& in, float clip_coef, offload::TilePipelineStats* io) {
  const UnitStep up{u.grad, u.segments, u.params, in.param_dtype, in.groups, in.step, clip_coef, in.executor};
  STRATA_ASSIGN_OR_RETURN(const offload::TilePipelineStats s, store.Step(unit, cfg, up));
  io->tiles += s.tiles;
  io->compute_ns += s.compute_ns;
  io->read_wait_ns += s.read_wait_ns;
  io->write_wait_ns += s.write_wait_ns;
  io->bytes_read += s.bytes_read;
  io->bytes_written += s.bytes_written;
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> RunOptimizerStep(StateStore& store, const OptimizerConfig& cfg, memory::TierOps& grads,
                                             const std::vector<StepUnit>& units, const StepInputs& in) {
  double local_sq = 0;
  for (const StepUnit& u : units) {
    STRATA_ASSIGN_OR_RETURN(const double sq, ScaleAndSumSquares(grads, u, in.grad_scale));
    local_sq += sq;
  }
  StepOutcome out;
  STRATA_RETURN_IF_ERROR(GlobalNorm(local_sq, in, &out));
  if (out.skipped) return out;
  // Units are independent here, so the order is free: last to first, so that with parameter shards on
  // NVMe the cache keeps the first units (the most recently written), which the next forward needs first.
  for (int unit = static_cast<int>(units.size()) - 1; unit >= 0; --unit) {
    STRATA_RETURN_IF_ERROR(UpdateUnit(store, cfg, units[unit].unit < 0 ? unit : units[unit].unit, units[unit], in,
                                      out.clip_coef, &out.io));
  }
  return out;
}

}  // namespace strata::optim
