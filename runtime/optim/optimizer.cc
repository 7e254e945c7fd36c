#include "runtime/optim/optimizer.h"

#include <cmath>

#include "kernels/common/element_math.h"

namespace strata::optim {

void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 double lr, int64_t step, float grad_scale) {
  if (cfg.type == OptimizerType::kAdamW) {
    const kernels::AdamWStep decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step);
    const kernels::AdamWStep no_decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, 0.0, step);
    for (const shard::Segment& seg : segs) {
      const kernels::AdamWStep& h = seg.weight_decay ? decay : no_decay;
      for (size_t i = seg.begin; i < seg.end; ++i) {
        kernels::AdamWElement(s.grad[i] * grad_scale, s.master[i], s.m[i], s.v[i], h);
      }
    }
    return;
  }
  const kernels::SgdStep decay{static_cast<float>(lr), static_cast<float>(cfg.momentum),
                               static_cast<float>(cfg.weight_decay)};
  const kernels::SgdStep no_decay{static_cast<float>(lr), static_cast<float>(cfg.momentum), 0.0f};
  for (const shard::Segment& seg : segs) {
    const kernels::SgdStep& h = seg.weight_decay ? decay : no_decay;
    for (size_t i = seg.begin; i < seg.end; ++i) kernels::SgdElement(s.grad[i] * grad_scale, s.master[i], s.m[i], h);
  }
}

int StateBuffers(const OptimizerConfig& cfg) {
  return cfg.type == OptimizerType::kAdamW ? 2 : 1;
}

float ClipCoefficient(double total_norm, double max_norm) {
  if (max_norm <= 0 || !(total_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (total_norm + 1e-6));
}

double ScheduledLr(const SchedulerConfig& sched, double base_lr, int64_t step) {

  if (sched.type == LrScheduleType::kConstant) return base_lr;
  if (step < sched.warmup_steps) {
    const double frac = static_cast<double>(step + 1) / static_cast<double>(sched.warmup_steps);
    return sched.warmup_min_lr + (base_lr - sched.warmup_min_lr) * frac;
  }
  if (sched.total_steps <= sched.warmup_steps) return base_lr;
  const double t = std::min(1.0, static_cast<double>(step - sched.warmup_steps) /
                                     static_cast<double>(sched.total_steps - sched.warmup_steps));
  const double shape = sched.type == LrScheduleType::kWarmupCosine ? 0.5 * (1.0 + std::cos(M_PI * t)) : 1.0 - t;
  return sched.min_lr + (base_lr - sched.min_lr) * shape;
}

double SumSquares(const float* x, size_t n) {
  double acc = 0;
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

}  // namespace strata::optim
