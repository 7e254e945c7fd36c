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
    const kernels::AdamWStep decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step);
    const kernels::AdamWStep no_decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, 0.0, step);
    std::vector<kernels::AdamWStep> own;  // segments with a step of their own (reserved: stable pointers)
    own.reserve(segs.size());
    std::vector<kc::AdamWSegment> runs;
    runs.reserve(segs.size());
    for (const shard::Segment& seg : segs) {
      if (seg.step > 0 && seg.step != step) {
        own.push_back(kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, seg.weight_decay ? cfg.weight_decay : 0.0,
                                             seg.step));
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

double SumSquares(const float* x, size_t n) { return kernels::cpu::SumSquaresInOrder(x, n); }

}  // namespace strata::optim
