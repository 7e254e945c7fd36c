// Optimizers over shard segments, gradient clipping and learning-rate schedules.
//
// The update runs over the runs of a shard that belong to parameters (Segment), so per-parameter policy
// (weight decay or not) is data, and padding is never touched. The element math is the shared
// kernels/common/element_math.h, so this loop, the vectorised host kernels and the CUDA kernels agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

// Applies one step of `cfg` to every segment of the range. `grad_scale` multiplies each gradient
// (clipping coefficient); `lr` is the scheduled rate; `step` counts from 1 (bias correction).
void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 double lr, int64_t step, float grad_scale);

// Number of fp32 state buffers the optimizer keeps per element (AdamW 2, SGD 1).
int StateBuffers(const OptimizerConfig& cfg);

// torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6) when norm > max_norm, else 1. 0 = off.
float ClipCoefficient(double total_norm, double max_norm);

// The learning rate at `step` (0-based: the rate used by the (step+1)-th update).
double ScheduledLr(const SchedulerConfig& sched, double base_lr, int64_t step);

// Sum of squares of x[0..n) in double.
double SumSquares(const float* x, size_t n);

}  // namespace strata::optim
