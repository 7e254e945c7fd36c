#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/common/element_math.h"
#include "kernels/cpu/optimizer_ops.h"
#include "kernels/cpu/tensor_ops.h"
#include "runtime/base/env.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
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

// Note [Param groups]
// A torch param group may carry its own lr and weight_decay; DeepSpeed builds its torch optimizer from the
// groups, so a group without the key takes the config's optimizer.params value. Strata carries them per
// parameter (shard::ParamSpec::own_lr / own_weight_decay, strata_param_spec.own_*), unset where the group
// takes the config's. The engine numbers the distinct (own lr, own decay) pairs as groups, 0 being the
// config's (no own value), and stamps each segment with its group (Segment::group); an update gets one
// GroupHyper per group: the group's scheduled lr and its decay coefficient, which applies to the segments
// whose weight-decay flag is set. Every back-end builds a segment's coefficients with SegmentAdamWStep /
// SegmentSgdStep below, so the host's and the device's bits agree.
// The lr of a group follows the config's schedule as DeepSpeed's lr_schedules.py applies it to each group:
//  - no scheduler: the group's own lr (torch's);
//  - WarmupCosineLR: the group's lr times the schedule's ratio (DeepSpeed's org_lrs[g] * ratio);
//  - WarmupLR: its warmup_max_lr defaults to each group's lr (`[group['lr'] for group in param_groups]`), so
//    the group's lr is its peak; a given warmup_max_lr (a number) is every group's peak (_format_param
//    broadcasts it), and the groups' own lrs are unused;
//  - WarmupDecayLR: warmup_max_lr defaults to 0.001, a number, so every group's peak is the schedule's.
// warmup_min_lr is one number for every group. Strata's own schedules (kWarmupLinear / kWarmupCosine, of
// `strata train --warmup / --lr-schedule`) take a group's lr as its peak, as torch's schedulers do with
// each group's base lr. SchedulerConfig::shared_peak marks the two cases where the peak is shared; the
// engine logs once which own lrs that leaves unused.
double GroupLr(const SchedulerConfig& sched, double config_lr, std::optional<double> own_lr, int64_t step) {
  return ScheduledLr(sched, own_lr.has_value() && !sched.shared_peak ? *own_lr : config_lr, step);
}

kernels::AdamWStep SegmentAdamWStep(const OptimizerConfig& cfg, const GroupHyper& g, const shard::Segment& seg,
                                    int64_t step) {
  return kernels::MakeAdamWStep(g.lr, cfg.beta1, cfg.beta2, cfg.eps, seg.weight_decay ? g.weight_decay : 0.0,
                                seg.step > 0 ? seg.step : step, cfg.adam_w_mode);
}

kernels::SgdStep SegmentSgdStep(const OptimizerConfig& cfg, const GroupHyper& g, const shard::Segment& seg) {
  return kernels::SgdStep{static_cast<float>(g.lr), static_cast<float>(cfg.momentum),
                          static_cast<float>(seg.weight_decay ? g.weight_decay : 0.0)};
}

void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 absl::Span<const GroupHyper> groups, int64_t step, float grad_scale, const UpdateOptions& options) {
  const kc::CpuKernels& k = options.executor ? options.executor->kernels() : DefaultHostKernels();
  kc::ThreadPool* pool = options.executor ? options.executor->pool() : nullptr;
  const kc::OptimizerArrays a = Arrays(s, options);
  for (const shard::Segment& seg : segs) {
    STRATA_CHECK_MSG(seg.group >= 0 && static_cast<size_t>(seg.group) < groups.size(),
                     "a segment's group has no coefficients in the update");
  }
  // Each segment points at its coefficients; segments of one group and step share them. Reserved up front:
  // the pointers stay valid.
  if (cfg.type == OptimizerType::kAdamW) {
    std::vector<kernels::AdamWStep> steps;
    steps.reserve(2 * groups.size() + segs.size());
    for (const GroupHyper& g : groups) {  // [2g]: decays, [2g + 1]: does not
      for (const bool decays : {true, false}) {
        steps.push_back(SegmentAdamWStep(cfg, g, shard::Segment{0, 0, -1, decays}, step));
      }
    }
    std::vector<kc::AdamWSegment> runs;
    runs.reserve(segs.size());
    for (const shard::Segment& seg : segs) {
      const kernels::AdamWStep* c = &steps[2 * seg.group + (seg.weight_decay ? 0 : 1)];
      if (seg.step > 0 && seg.step != step) {  // a step count of its own (Note [Parameters without a gradient])
        steps.push_back(SegmentAdamWStep(cfg, groups[seg.group], seg, step));
        c = &steps.back();
      }
      runs.push_back({seg.begin, seg.end, c});
    }
    kc::AdamWSegments(k, pool, a, runs.data(), runs.size(), grad_scale);
    return;
  }
  std::vector<kernels::SgdStep> steps;
  steps.reserve(segs.size());
  std::vector<kc::SgdSegment> runs;
  runs.reserve(segs.size());
  for (const shard::Segment& seg : segs) {
    steps.push_back(SegmentSgdStep(cfg, groups[seg.group], seg));
    runs.push_back({seg.begin, seg.end, &steps.back()});
  }
  kc::SgdSegments(k, pool, a, runs.data(), runs.size(), grad_scale);
}

void ApplyUpdate(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs, double lr,
                 int64_t step, float grad_scale, const UpdateOptions& options) {
  const GroupHyper one{lr, cfg.weight_decay};
  ApplyUpdate(cfg, s, segs, absl::MakeConstSpan(&one, 1), step, grad_scale, options);
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
