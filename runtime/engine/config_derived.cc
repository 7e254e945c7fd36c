// What follows from an EngineConfig (config.h) as a whole: the settings every rank must share (Note [One
// configuration]) and the "auto" values resolved, as text; the check of the update in backward against the
// rest; and the sizes the engine, `strata doctor` and `strata plan` derive from the config alone. Parsing
// and validation of the JSON are config.cc's.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/engine/config.h"
#include "runtime/optim/optimizer.h"

namespace strata::engine {

std::vector<std::pair<std::string, std::string>> JobWideFields(const EngineConfig& c) {
  auto num = [](double v) { return absl::StrFormat("%.17g", v); };
  auto offload = [](OffloadDevice d) {
    return std::string(d == OffloadDevice::kNone ? "none" : d == OffloadDevice::kCpu ? "cpu" : "nvme");
  };
  const char* const kSchedules[] = {"constant", "warmup-linear", "warmup-cosine", "WarmupLR", "WarmupDecayLR",
                                    "WarmupCosineLR"};
  const char* schedule = kSchedules[static_cast<int>(c.scheduler.type)];
  return {
      {"zero_optimization.stage", absl::StrCat(c.stage)},
      {"train_micro_batch_size_per_gpu", absl::StrCat(c.train_micro_batch_size_per_gpu)},
      {"gradient_accumulation_steps", absl::StrCat(c.gradient_accumulation_steps)},
      {"train_batch_size", absl::StrCat(c.train_batch_size)},
      {"gradient_clipping", num(c.gradient_clipping)},
      {"bf16.enabled", c.bf16 ? "true" : "false"},
      {"fp16.enabled", c.fp16.enabled ? "true" : "false"},
      {"fp16.initial_scale_power", num(c.fp16.initial_scale_power)},
      {"fp16.loss_scale_window", absl::StrCat(c.fp16.loss_scale_window)},
      {"fp16.min_loss_scale", num(c.fp16.min_loss_scale)},
      {"fp16.loss_scale", num(c.fp16.static_loss_scale)},
      {"fp16.hysteresis", absl::StrCat(c.fp16.hysteresis)},
      {"fp16.consecutive_hysteresis", c.fp16.consecutive_hysteresis ? "true" : "false"},
      {"optimizer.type", c.optimizer.type == OptimizerType::kAdamW ? "AdamW" : "SGD"},
      {"optimizer.params.lr", num(c.optimizer.lr)},
      {"optimizer.params.betas[0]", num(c.optimizer.beta1)},
      {"optimizer.params.betas[1]", num(c.optimizer.beta2)},
      {"optimizer.params.eps", num(c.optimizer.eps)},
      {"optimizer.params.weight_decay", num(c.optimizer.weight_decay)},
      {"optimizer.params.momentum", num(c.optimizer.momentum)},
      {"optimizer.params.adam_w_mode", c.optimizer.adam_w_mode ? "true" : "false"},
      {"scheduler.type", schedule},
      {"scheduler.params.warmup_num_steps", absl::StrCat(c.scheduler.warmup_steps)},
      {"scheduler.params.total_num_steps", absl::StrCat(c.scheduler.total_steps)},
      {"scheduler.params.warmup_min_lr", num(c.scheduler.warmup_min_lr)},
      {"scheduler.params.cos_min_ratio (the floor)", num(c.scheduler.min_lr)},
      {"scheduler.params.warmup_type", c.scheduler.log_warmup ? "log" : "linear"},
      {"scheduler.params.warmup_min_ratio", num(c.scheduler.warmup_min_ratio)},
      {"scheduler.params.cos_min_ratio", num(c.scheduler.cos_min_ratio)},
      // Note [Param groups]: whose lr a param group's schedule rises to
      {"scheduler.peak", c.scheduler.shared_peak ? "warmup_max_lr, for every param group" : "each param group's lr"},
      {"zero_optimization.offload_param.device", offload(c.offload_param.device)},
      {"zero_optimization.offload_optimizer.device", offload(c.offload_optimizer.device)},
      {"zero_optimization.shard_group_size", absl::StrCat(c.shard_group_size)},
      {"strata.param_dtype", std::string(DTypeName(c.param_dtype))},
      {"strata.reduce_dtype", std::string(DTypeName(c.reduce_dtype))},
      {"strata.max_live_units", absl::StrCat(c.max_live_units)},
      {"strata.prefetch_depth", absl::StrCat(c.prefetch_depth)},
      {"strata.reshard_after_forward", c.reshard_after_forward ? "true" : "false"},
      {"strata.seed", absl::StrCat(c.seed)},
      {"strata.optimizer_in_backward", c.optimizer_in_backward ? "true" : "false"},
      {"strata.params_without_grad", c.skip_params_without_grad ? "skip" : "zero"},
      {"strata.weight_decay_1d", c.weight_decay_1d ? "true" : "false"},
  };
}

std::string ResolvedAutoLine(const EngineConfig& cfg) {
  if (cfg.auto_resolved.empty()) return "";
  std::vector<std::pair<std::string, std::string>> fields = JobWideFields(cfg);
  fields.emplace_back("optimizer.params.betas", absl::StrFormat("[%g, %g]", cfg.optimizer.beta1, cfg.optimizer.beta2));
  std::vector<std::string> parts;
  for (const std::string& entry : cfg.auto_resolved) {
    auto it = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.first == entry; });
    parts.push_back(it == fields.end() ? entry : absl::StrCat(entry, " = ", it->second));
  }
  return absl::StrCat("config: \"auto\" resolved: ", absl::StrJoin(parts, ", "));
}

// Each refusal says why the fused step cannot do it (docs/decisions/0018-step-in-backward.md); every conflict
// is named at once (Note [One pass, every problem]).
absl::Status CheckOptimizerInBackward(const EngineConfig& cfg) {
  if (!cfg.optimizer_in_backward) return absl::OkStatus();
  std::vector<std::string> why;
  if (cfg.stage < 2) {
    why.push_back(absl::StrCat("zero_optimization.stage is ", cfg.stage,
                               "; it needs stage 2 or 3 (at stages 0-1 the all-reduced gradient is the full gradient "
                               "buffer itself, so updating in backward would save no memory)"));
  }
  if (cfg.gradient_accumulation_steps != 1) {
    why.push_back(absl::StrCat("gradient_accumulation_steps is ", cfg.gradient_accumulation_steps,
                               "; it needs 1 (accumulating micro-batches needs the gradient shard kept between them)"));
  }
  if (cfg.gradient_clipping != 0) {
    why.push_back(absl::StrCat("gradient_clipping is ", cfg.gradient_clipping,
                               "; clipping by the global norm needs the norm before the first update, and the norm "
                               "is known only when backward ends; set gradient_clipping to 0"));
  }
  if (cfg.fp16.enabled) {
    why.push_back("fp16.enabled is true; an fp16 overflow must skip the whole step, and the units are updated before "
                  "it is known; use bf16");
  }
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("config key 'strata.optimizer_in_backward' is true, but ", absl::StrJoin(why, "; and ")));
}

int LiveGatheredUnits(const EngineConfig& cfg, int units) {
  return cfg.stage == 3 && !cfg.reshard_after_forward ? std::max(cfg.max_live_units, units) : cfg.max_live_units;
}

size_t NvmeTileElems(const EngineConfig& cfg, size_t largest_update) {
  const size_t configured = std::max<uint64_t>(cfg.nvme_tile_elems, 1024);
  return std::min(configured, std::max<size_t>((largest_update + 1023) / 1024 * 1024, 1024));
}

int NvmeLanes(const EngineConfig& cfg) { return 1 + optim::StateBuffers(cfg.optimizer); }

size_t NvmeStagingTiles(const EngineConfig& cfg) {
  return std::max<size_t>(cfg.offload_optimizer.buffer_count, 3 * static_cast<size_t>(NvmeLanes(cfg)));
}

int OptimizerThreads(const EngineConfig& cfg) {
  if (cfg.optimizer_threads > 0) return cfg.optimizer_threads;
  const int allowed = static_cast<int>(kernels::cpu::AllowedCpus().size());  // 0 if the mask is unreadable
  return std::clamp(allowed, 1, kMaxDefaultOptimizerThreads);
}

size_t NvmeParamBuffers(const EngineConfig& cfg, int live) {
  return std::max<size_t>(cfg.offload_param.buffer_count, static_cast<size_t>(live) + 1);
}

}  // namespace strata::engine
