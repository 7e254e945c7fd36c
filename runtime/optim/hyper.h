// Optimizer and learning-rate schedule hyper-parameters. The engine's JSON config fills these; they
// live here so the optimizer layer does not depend on the engine layer above it.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::optim {

enum class OptimizerType { kAdamW, kSgd };
// kWarmupLinear / kWarmupCosine are `strata train`'s own schedules (--warmup, --lr-schedule). The kWarmupLR,
// kWarmupDecayLR and kWarmupCosineLR are DeepSpeed's lr_schedules of those names, formula for formula
// (Note [DeepSpeed's schedules], optimizer.cc): the config's "scheduler" block always means those.
enum class LrScheduleType { kConstant, kWarmupLinear, kWarmupCosine, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD only
  // DeepSpeed's adam_w_mode (Adam / AdamW): true = decoupled weight decay (AdamW); false = L2, the decay
  // added to the gradient before the moments (torch.optim.Adam's weight_decay).
  bool adam_w_mode = true;
};

struct SchedulerConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    // decay horizon for linear / cosine; 0 = no decay
  double warmup_min_lr = 0;   // lr at step 0 of the warm-up
  double min_lr = 0;          // floor after decay
  // DeepSpeed's schedules only:
  bool log_warmup = true;         // warmup_type "log" (DeepSpeed's default) or "linear"
  double warmup_min_ratio = 0;    // WarmupCosineLR: the warm-up starts at this fraction of the lr
  double cos_min_ratio = 1e-4;    // WarmupCosineLR: the floor, as a fraction of the lr
  // Every parameter's peak is the config's lr (the schedule's warmup_max_lr), its own lr unused: DeepSpeed's
  // WarmupDecayLR, and WarmupLR given warmup_max_lr (Note [Param groups], optimizer.cc).
  bool shared_peak = false;
};

// One param group's coefficients at one update (Note [Param groups], optimizer.cc): its scheduled lr and the
// weight decay of its parameters that decay (shard::Segment::weight_decay). An update takes one per group,
// indexed by shard::Segment::group; group 0 is the config's (OptimizerConfig::lr scheduled, ::weight_decay).
struct GroupHyper {
  double lr = 0;
  double weight_decay = 0;
};
using GroupHypers = std::vector<GroupHyper>;

}  // namespace strata::optim
