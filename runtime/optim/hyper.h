// Optimizer and learning-rate schedule hyper-parameters. The engine's JSON config fills these; they
// live here so the optimizer layer does not depend on the engine layer above it.
#pragma once

#include <cstdint>

namespace strata::optim {

enum class OptimizerType { kAdamW, kSgd };
enum class LrScheduleType { kConstant, kWarmupLinear, kWarmupCosine };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD only
};

struct SchedulerConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    // decay horizon for linear / cosine; 0 = no decay
  double warmup_min_lr = 0;   // lr at step 0 of the warm-up
  double min_lr = 0;          // floor after decay
};

}  // namespace strata::optim
