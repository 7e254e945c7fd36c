// Optimizers over shard segments, gradient clipping and learning-rate schedules.
//
// The update runs over the runs of a shard that belong to parameters (Segment), so per-parameter policy
// (weight decay or not, the param group's lr and decay) is data, and padding is never touched. It runs the
// fused host kernels (kernels/cpu: one pass reads grad, master, m, v and writes master, m, v and the optional
// param copy); their element math is the shared kernels/common/element_math.h, so the result is bit for bit the
// scalar element loop's, for every kernel variant and thread count, and agrees with the CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "kernels/common/element_math.h"
#include "runtime/base/dtype.h"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/hyper.h"
#include "runtime/shard/layout.h"

namespace strata::optim {

// Pointers to one update range (all the same length, fp32). `v` is unused by SGD.
struct ShardState {
  float* master;
  const float* grad;
  float* m;
  float* v;
};

// Optional parts of one update.
struct UpdateOptions {
  // When set, param_copy[i] (index-aligned with master) receives the updated master[i] rounded to nearest
  // even in param_copy_dtype (kBF16 or kF16; kF32 means no copy), in the same pass, for segment elements.
  uint16_t* param_copy = nullptr;
  DType param_copy_dtype = DType::kF32;
  // Threads and kernel variant; nullptr: the calling thread and the default variant (STRATA_CPU_ISA,
  // else the widest this CPU supports).
  HostExecutor* executor = nullptr;
};

// Applies one step of `cfg` to every segment of the range. `grad_scale` multiplies each gradient
// (clipping coefficient); each segment takes the lr and weight decay of its group, groups[seg.group] (Note
// [Param groups]); `step` counts from 1 (bias correction). cfg.lr and cfg.weight_decay are not read.
void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 absl::Span<const GroupHyper> groups, int64_t step, float grad_scale,
                 const UpdateOptions& options = {});
// The same with one group, {lr, cfg.weight_decay}: every segment's group must be 0.
void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 double lr, int64_t step, float grad_scale, const UpdateOptions& options = {});

// The element-math coefficients of one segment's update (Note [Param groups]): its group's lr, its group's
// decay where the segment decays (else 0), and its own step count where it has one (seg.step > 0). Every
// back-end builds them here, so that host and device updates agree bit for bit.
kernels::AdamWStep SegmentAdamWStep(const OptimizerConfig& cfg, const GroupHyper& g, const shard::Segment& seg,
                                    int64_t step);
kernels::SgdStep SegmentSgdStep(const OptimizerConfig& cfg, const GroupHyper& g, const shard::Segment& seg);

// The kernel table ApplyUpdate uses without an executor: STRATA_CPU_ISA (runtime/base/env) when it names
// a variant this CPU supports, else the widest supported (a bad value is logged once, not fatal).
const kernels::cpu::CpuKernels& DefaultHostKernels();

// Number of fp32 state buffers the optimizer keeps per element (AdamW 2, SGD 1).
int StateBuffers(const OptimizerConfig& cfg);

// torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6) when norm > max_norm, else 1. 0 = off.
float ClipCoefficient(double total_norm, double max_norm);

// The learning rate at `step` (0-based: the rate used by the (step+1)-th update).
double ScheduledLr(const SchedulerConfig& sched, double base_lr, int64_t step);
// The learning rate at `step` of a parameter whose own lr is `own_lr` (unset: the config's, `config_lr`),
// under the config's schedule, by DeepSpeed's rule (Note [Param groups]).
double GroupLr(const SchedulerConfig& sched, double config_lr, std::optional<double> own_lr, int64_t step);

// Sum of squares of x[0..n) in double, sequentially in index order. (HostExecutor::SumSquares is the
// vectorised, multi-threaded one; its fixed order differs from this one in the last bits.)
double SumSquares(const float* x, size_t n);

}  // namespace strata::optim
