#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/common/element_math.h"
#include "kernels/cpu/optimizer_ops.h"
#include "kernels/cpu/tensor_ops.h"
#include "runtime/base/env.h"
#include "runtime/base/logging.h"
#include "runtime/optim/state_kind.h"

namespace strata::optim {

namespace {

namespace kc = ::strata::kernels::cpu;

kc::OptimizerArrays Arrays(const ShardState& s, const UpdateOptions& o) {
  kc::OptimizerArrays a{s.master, s.grad, s.m, s.v, o.param_copy, kc::ParamCopy::kNone};
  if (o.param_copy != nullptr && o.param_copy_dtype != DType::kF32) {
    a.copy = o.param_copy_dtype == DType::kBF16 ? kc::ParamCopy::kBf16 : kc::ParamCopy::kF16;
  }
  return a;
}

}  // namespace

const kc::CpuKernels& DefaultHostKernels() {
  static const kc::CpuKernels* const k = [] {
    const std::string forced = env::ForcedCpuIsa();
    auto r = HostExecutor::ResolveKernels(forced);
    if (r.ok()) return *r;
    STRATA_LOG(Warning) << "STRATA_CPU_ISA=" << forced << " ignored: " << r.status().message();
    return kc::GetCpuKernels(kc::BestIsa());
  }();
  return *k;
}

void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 double lr, int64_t step, float grad_scale, const UpdateOptions& options) {
  const kc::CpuKernels& k = options.executor ? options.executor->kernels() : DefaultHostKernels();
  kc::ThreadPool* pool = options.executor ? options.executor->pool() : nullptr;
  const kc::OptimizerArrays a = Arrays(s, options);
  if (cfg.type == OptimizerType::kAdamW) {
    const bool w = cfg.adam_w_mode;
    const kernels::AdamWStep decay =
        kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step, w);
    const kernels::AdamWStep no_decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, 0.0, step, w);
    std::vector<kernels::AdamWStep> own;  // segments with a step of their own (reserved: stable pointers)
    own.reserve(segs.size());
    std::vector<kc::AdamWSegment> runs;
    runs.reserve(segs.size());
    for (const shard::Segment& seg : segs) {
      if (seg.step > 0 && seg.step != step) {
        own.push_back(kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps,
                                             seg.weight_decay ? cfg.weight_decay : 0.0, seg.step, w));
        runs.push_back({seg.begin, seg.end, &own.back()});
      } else {
        runs.push_back({seg.begin, seg.end, seg.weight_decay ? &decay : &no_decay});
      }
    }
    kc::AdamWSegments(k, pool, a, runs.data(), runs.size(), grad_scale);
    return;
  }
  const kernels::SgdStep decay{static_cast<float>(lr), static_cast<float>(cfg.momentum),
                               static_cast<float>(cfg.weight_decay)};
  const kernels::SgdStep no_decay{static_cast<float>(lr), static_cast<float>(cfg.momentum), 0.0f};
  std::vector<kc::SgdSegment> runs;
  runs.reserve(segs.size());
  for (const shard::Segment& seg : segs) runs.push_back({seg.begin, seg.end, seg.weight_decay ? &decay : &no_decay});
  kc::SgdSegments(k, pool, a, runs.data(), runs.size(), grad_scale);
}

int StateBuffers(const OptimizerConfig& cfg) { return static_cast<int>(StateKinds(cfg.type).size()) - 1; }

float ClipCoefficient(double total_norm, double max_norm) {
  if (max_norm <= 0 || !(total_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (total_norm + 1e-6));
}

namespace {

// Note [DeepSpeed's schedules]
// deepspeed/runtime/lr_schedules.py, read as the DeepSpeed engine drives it: the scheduler is built with
// last_batch_iteration -1, which sets the lr the first update uses (WarmupLR / WarmupDecayLR: warmup_min_lr;
// WarmupCosineLR: 0), and steps once after every applied update (never after a skipped fp16 step). So the
// update that follows `step` applied ones runs at DeepSpeed's lr for iteration i = step - 1. With
// W = max(2, warmup_num_steps) and T = total_num_steps, during the warm-up (i < W) the fraction is
// ln(i + 1) / ln(W) ("log", the default) or i / W ("linear"); then WarmupLR stays at the peak, WarmupDecayLR
// falls as max(0, (T - i) / max(1, T - W)), and WarmupCosineLR follows
// cos_min_ratio + (1 - cos_min_ratio)(1 + cos(pi min(1, (i - W + 1) / max(1, T - W)))) / 2 of the lr.
// WarmupLR / WarmupDecayLR go from warmup_min_lr to the peak (`base_lr`, the config's warmup_max_lr);
// WarmupCosineLR multiplies the lr by warmup_min_ratio + fraction (1 - warmup_min_ratio) while warming up.
double DeepSpeedLr(const SchedulerConfig& s, double base_lr, int64_t step) {
  const int64_t i = step - 1;
  const bool cosine = s.type == LrScheduleType::kWarmupCosineLR;
  if (i < 0) return cosine ? 0.0 : s.warmup_min_lr;
  const double w = static_cast<double>(std::max<int64_t>(2, s.warmup_steps));
  const double it = static_cast<double>(i);
  double gamma = 1.0;
  if (it < w) {
    gamma = s.log_warmup ? (1.0 / std::log(w)) * std::log(it + 1) : it / w;
    if (cosine) return base_lr * (s.warmup_min_ratio + gamma * (1.0 - s.warmup_min_ratio));
  } else if (cosine) {
    const double progress = std::min(1.0, (it - w + 1) / std::max(1.0, static_cast<double>(s.total_steps) - w));
    const double ratio = (1 + std::cos(M_PI * progress)) / 2;
    return base_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * ratio);
  } else if (s.type == LrScheduleType::kWarmupDecayLR) {
    const double t = static_cast<double>(s.total_steps);
    gamma = std::max(0.0, (t - it) / std::max(1.0, t - w));
  }
  return s.warmup_min_lr + (base_lr - s.warmup_min_lr) * gamma;
}

}  // namespace

double ScheduledLr(const SchedulerConfig& sched, double base_lr, int64_t step) {
  if (sched.type == LrScheduleType::kConstant) return base_lr;
  if (sched.type != LrScheduleType::kWarmupLinear && sched.type != LrScheduleType::kWarmupCosine) {
    return DeepSpeedLr(sched, base_lr, step);
  }
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

double SumSquares(const float* x, size_t n) { return kernels::cpu::SumSquaresInOrder(x, n); }

}  // namespace strata::optim
