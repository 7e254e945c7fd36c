#include "runtime/engine/config_deepspeed.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace strata::engine::deepspeed {
namespace {

using json = nlohmann::json;
constexpr KeyKind kNoEffect = KeyKind::kNoEffect;
constexpr KeyKind kEquivalent = KeyKind::kEquivalent;
constexpr KeyKind kMissing = KeyKind::kMissing;

constexpr char kCheckpointing[] =
    "Strata's activation checkpointing: `strata train --activation-checkpointing`; in strata.torch, checkpoint "
    "the model's blocks yourself (torch.utils.checkpoint, or model.gradient_checkpointing_enable() for a Hugging "
    "Face model); remove this block";
constexpr char kNoZeroPlusPlus[] = "ZeRO++ quantized communication; remove the key (or set it to false)";

// clang-format off
const KeyInfo kKeys[] = {
    // Top level: monitors, logging and DeepSpeed's own machinery.
    {"steps_per_print", kNoEffect, "", nullptr},
    {"wall_clock_breakdown", kNoEffect, "", nullptr},
    {"dump_state", kNoEffect, "", nullptr},
    {"memory_breakdown", kNoEffect, "", nullptr},
    {"tensorboard", kNoEffect, "", nullptr},
    {"wandb", kNoEffect, "", nullptr},
    {"csv_monitor", kNoEffect, "", nullptr},
    {"comet", kNoEffect, "", nullptr},
    {"comms_logger", kNoEffect, "", nullptr},
    {"flops_profiler", kNoEffect, "", nullptr},
    {"timers", kNoEffect, "", nullptr},
    {"autotuning", kNoEffect, "", nullptr},
    {"aio", kNoEffect, "", nullptr},
    {"checkpoint", kNoEffect, "", nullptr},
    {"dataloader_drop_last", kNoEffect, "", nullptr},
    {"zero_allow_untested_optimizer", kNoEffect, "", nullptr},
    {"zero_force_ds_cpu_optimizer", kNoEffect, "", nullptr},
    {"prescale_gradients", kNoEffect, "", nullptr},
    {"gradient_predivide_factor", kNoEffect, "", nullptr},
    {"fp16.auto_cast", kMissing, "fp16 autocast of the inputs; cast them in the model", "false"},
    {"fp16.fp16_master_weights_and_grads", kMissing, "fp16 master weights; Strata keeps an fp32 master",
     "false"},
    {"bf16.immediate_grad_update", kNoEffect, "", nullptr},
    {"bf16.check_grad_overflow", kNoEffect, "", nullptr},
    {"bf16.bf16_master_weights_and_grads", kMissing, "bf16 master weights; Strata keeps an fp32 master", "false"},
    {"bf16.bf16_optimizer_states", kMissing, "bf16 optimizer states; Strata keeps them in fp32", "false"},
    {"bfloat16", kEquivalent, "'bf16' (the same block under its current name)", nullptr},
    {"activation_checkpointing", kEquivalent, kCheckpointing, nullptr},
    {"communication_data_type", kEquivalent,
     "'strata.reduce_dtype' (gradients are reduced in fp32; remove the key)", nullptr},
    {"amp", kMissing, "NVIDIA Apex AMP; use \"bf16\": {\"enabled\": true} or fp16", nullptr},
    {"sparse_gradients", kMissing, "sparse embedding gradients; remove the key", "false"},
    {"elasticity", kMissing, "elastic training; remove the block and fix the batch sizes", nullptr},
    {"pipeline", kMissing, "pipeline parallelism; Strata is data parallel (ZeRO) only", nullptr},
    {"compression_training", kMissing, "DeepSpeed Compression; remove the block", nullptr},
    {"data_efficiency", kMissing, "DeepSpeed data efficiency (curriculum, token dropping); remove the block",
     nullptr},
    {"curriculum_learning", kMissing, "curriculum learning; remove the block", nullptr},
    {"hybrid_engine", kMissing, "DeepSpeed-Chat's hybrid engine (inference kernels); remove the block", nullptr},
    {"tensor_parallel", kMissing, "tensor parallelism; Strata is data parallel (ZeRO) only", nullptr},
    {"sequence_parallel_size", kMissing, "sequence parallelism; remove the key", "1"},
    {"zero_optimization.overlap_comm", kNoEffect, "", nullptr},
    {"zero_optimization.contiguous_gradients", kNoEffect, "", nullptr},
    {"zero_optimization.reduce_scatter", kNoEffect, "", nullptr},
    {"zero_optimization.reduce_bucket_size", kNoEffect, "", nullptr},
    {"zero_optimization.allgather_bucket_size", kNoEffect, "", nullptr},
    {"zero_optimization.allgather_partitions", kNoEffect, "", nullptr},
    {"zero_optimization.use_multi_rank_bucket_allreduce", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_prefetch_bucket_size", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_param_persistence_threshold", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_model_persistence_threshold", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_max_live_parameters", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_max_reuse_distance", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_module_granularity_threshold", kNoEffect, "", nullptr},
    {"zero_optimization.sub_group_size", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", kNoEffect, "", nullptr},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", kNoEffect, "", nullptr},
    {"zero_optimization.round_robin_gradients", kNoEffect, "", nullptr},
    {"zero_optimization.elastic_checkpoint", kNoEffect, "", nullptr},
    {"zero_optimization.load_from_fp32_weights", kNoEffect, "", nullptr},
    {"zero_optimization.ignore_unused_parameters", kNoEffect, "", nullptr},
    {"zero_optimization.memory_efficient_linear", kNoEffect, "", nullptr},
    {"zero_optimization.log_trace_cache_warnings", kNoEffect, "", nullptr},
    {"zero_optimization.offload_param.buffer_size", kNoEffect, "", nullptr},
    {"zero_optimization.offload_param.max_in_cpu", kNoEffect, "", nullptr},
    {"zero_optimization.offload_optimizer.buffer_size", kNoEffect, "", nullptr},
    {"zero_optimization.offload_optimizer.pipeline_read", kNoEffect, "", nullptr},
    {"zero_optimization.offload_optimizer.pipeline_write", kNoEffect, "", nullptr},
    {"zero_optimization.offload_optimizer.fast_init", kNoEffect, "", nullptr},
    {"zero_optimization.offload_optimizer.ratio", kMissing,
     "a partial optimizer offload; offload all of it (remove the key) or none", "1"},
    {"zero_optimization.zero_hpz_partition_size", kEquivalent,
     "'zero_optimization.shard_group_size' (hybrid sharding: shard within groups of that many ranks)", nullptr},
    {"zero_optimization.mics_shard_size", kEquivalent,
     "'zero_optimization.shard_group_size' (MiCS: shard within groups of that many ranks)", nullptr},
    {"zero_optimization.mics_hierarchical_params_gather", kNoEffect, "", nullptr},
    {"zero_optimization.cpu_offload", kEquivalent,
     "'zero_optimization.offload_optimizer': {\"device\": \"cpu\"}", "false"},
    {"zero_optimization.cpu_offload_param", kEquivalent,
     "'zero_optimization.offload_param': {\"device\": \"cpu\"}", "false"},
    {"zero_optimization.cpu_offload_use_pin_memory", kEquivalent,
     "'zero_optimization.offload_optimizer.pin_memory' / 'offload_param.pin_memory'", "false"},
    {"zero_optimization.zero_quantized_weights", kMissing, kNoZeroPlusPlus, "false"},
    {"zero_optimization.zero_quantized_nontrainable_weights", kMissing, kNoZeroPlusPlus, "false"},
    {"zero_optimization.zero_quantized_gradients", kMissing, kNoZeroPlusPlus, "false"},
    {"zero_optimization.ignore_missing_optim_state", kNoEffect, "", nullptr},
    {"data_types.grad_accum_dtype", kMissing, "gradient accumulation in another dtype; Strata accumulates in fp32",
     "\"fp32\""},
    {"optimizer.params.bias_correction", kMissing, "Adam without bias correction; remove the key", "true"},
    {"optimizer.params.amsgrad", kMissing, "AMSGrad; remove the key", "false"},
    {"zero_optimization.legacy_stage1", kMissing, "the legacy stage-1 implementation; remove the key", "false"},
};
// clang-format on

}  // namespace

bool HasKeysUnder(const std::string& path) {
  const std::string prefix = absl::StrCat(path, ".");
  for (const KeyInfo& k : kKeys) {
    if (absl::StartsWith(k.path, prefix)) return true;
  }
  return false;
}

const KeyInfo* FindKey(const std::string& path) {
  for (const KeyInfo& k : kKeys) {
    if (path == k.path || absl::StartsWith(path, absl::StrCat(k.path, "."))) return &k;
  }
  return nullptr;
}

void Judge(const KeyInfo& key, const std::string& path, const json& v, std::string* problem, bool* no_effect) {
  *no_effect = false;
  problem->clear();
  if (key.kind == kNoEffect || (key.off_value != nullptr && v == json::parse(key.off_value))) {
    *no_effect = true;
    return;
  }
  if (key.kind == kEquivalent) {
    *problem = absl::StrCat("config key '", path, "' is DeepSpeed's; Strata's equivalent is ", key.advice);
    return;
  }
  *problem = absl::StrCat("config key '", path, "' is a DeepSpeed feature Strata does not have (", key.advice, ")");
}

namespace {

// Where "auto" is replaced (Hugging Face's trainer_config_process / trainer_config_finalize).
struct AutoRule {
  const char* path;
  const char* becomes;  // documentation: where the value comes from
};

json* At(json* doc, const std::string& path, json** parent, std::string* leaf) {
  json* node = doc;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(parts[i]);
    if (it == node->end()) return nullptr;
    if (i + 1 == parts.size()) {
      *parent = node;
      *leaf = parts[i];
    }
    node = &*it;
  }
  return node;
}

bool IsAuto(const json* v) { return v != nullptr && v->is_string() && v->get<std::string>() == "auto"; }

// The optimizer's lr as the config will have it (Strata's default 1e-3 when absent or "auto").
double OptimizerLr(json* doc) {
  json* parent = nullptr;
  std::string leaf;
  const json* lr = At(doc, "optimizer.params.lr", &parent, &leaf);
  return lr != nullptr && lr->is_number() ? lr->get<double>() : OptimizerConfig{}.lr;
}

}  // namespace

void ResolveAuto(const ConfigFacts& facts, json* doc, std::vector<std::pair<std::string, std::string>>* problems,
                 std::vector<std::string>* resolved) {
  // Absent: the batch triangle, the optimizer's defaults and the front end's flags decide.
  static const AutoRule kAbsent[] = {
      {"train_batch_size", "micro-batch x accumulation x ranks"},
      {"train_micro_batch_size_per_gpu", "the front end's micro-batch (1 unless set)"},
      {"gradient_accumulation_steps", "derived from train_batch_size, else 1"},
      {"optimizer.params.lr", "the default lr 1e-3 (or --lr)"},
      {"optimizer.params.betas", "[0.9, 0.999]"},
      {"optimizer.params.eps", "1e-8"},
      {"optimizer.params.weight_decay", "0 (or --weight-decay)"},
      {"fp16.enabled", "false (or --param-dtype)"},
      {"bf16.enabled", "false (or --param-dtype)"},
  };
  json* parent = nullptr;
  std::string leaf;
  for (const AutoRule& r : kAbsent) {
    if (!IsAuto(At(doc, r.path, &parent, &leaf))) continue;
    parent->erase(leaf);
    resolved->push_back(r.path);  // its value is known once the config is resolved: ResolvedAutoLine
  }
  auto set = [&](const char* path, const json& value) {
    if (!IsAuto(At(doc, path, &parent, &leaf))) return;
    (*parent)[leaf] = value;
    resolved->push_back(absl::StrCat(path, " = ", value.dump()));
  };
  set("gradient_clipping", 1.0);  // Hugging Face's TrainingArguments.max_grad_norm default
  set("scheduler.params.warmup_min_lr", 0);
  set("scheduler.params.warmup_max_lr", OptimizerLr(doc));
  if (facts.total_steps > 0) set("scheduler.params.total_num_steps", facts.total_steps);
  const int64_t h = facts.hidden_size;
  if (h > 0) {
    set("zero_optimization.reduce_bucket_size", h * h);
    set("zero_optimization.stage3_prefetch_bucket_size", static_cast<int64_t>(std::floor(0.9 * double(h) * double(h))));
    set("zero_optimization.stage3_param_persistence_threshold", 10 * h);
  }
  auto refuse = [&](const char* path, const char* message) {
    if (!IsAuto(At(doc, path, &parent, &leaf))) return;
    parent->erase(leaf);
    problems->emplace_back(path, absl::StrCat("config key '", path, "' is \"auto\", ", message));
  };
  refuse("scheduler.params.total_num_steps",
         "which needs the run's length: set it to the number of optimizer steps (strata train fills it from --steps)");
  refuse("scheduler.params.warmup_num_steps",
         "which Strata cannot resolve (Hugging Face takes it from --warmup_steps / --warmup_ratio): set the number "
         "of warm-up steps, >= 1");
}

}  // namespace strata::engine::deepspeed

namespace strata::engine {

absl::Status ResolveBatchSizes(int world_size, EngineConfig* cfg) {
  const int64_t world = world_size;
  int64_t micro = cfg->train_micro_batch_size_per_gpu;
  int64_t accum = cfg->gradient_accumulation_steps;
  const int64_t batch = cfg->train_batch_size;
  std::string derived;
  if (batch > 0 && !cfg->micro_batch_given && !cfg->accumulation_given) {
    accum = 1;
    micro = batch / world;
    derived = "train_micro_batch_size_per_gpu (with gradient_accumulation_steps 1)";
  } else if (batch > 0 && !cfg->accumulation_given) {
    accum = batch / micro / world;
    derived = "gradient_accumulation_steps";
  } else if (batch > 0 && !cfg->micro_batch_given) {
    micro = batch / world / accum;
    derived = "train_micro_batch_size_per_gpu";
  }
  const int64_t product = micro * accum * world;
  if (micro < 1 || accum < 1 || (batch > 0 && batch != product)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config keys train_batch_size (", batch, "), train_micro_batch_size_per_gpu (", micro,
        ") and gradient_accumulation_steps (", accum, ") disagree over ", world,
        " data-parallel ranks: train_batch_size must equal micro-batch x accumulation x ranks = ", micro, " x ",
        accum, " x ", world, " = ", product,
        derived.empty() ? "" : absl::StrCat(" (", derived, " derived by DeepSpeed's rule, rounding down)"),
        "; set train_batch_size to a multiple of the ranks that fits, or leave one of the three out to derive it"));
  }
  if (micro > INT32_MAX || accum > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("config key train_batch_size (", batch, ") gives a ", derived,
                                                   " beyond 2147483647"));
  }
  if (!derived.empty() && (cfg->train_micro_batch_size_per_gpu != micro || cfg->gradient_accumulation_steps != accum)) {
    cfg->notes.push_back(absl::StrCat("config: train_batch_size ", batch, " = micro-batch ", micro, " x accumulation ",
                                      accum, " x ", world, " ranks (", derived, " derived)"));
  }
  cfg->train_micro_batch_size_per_gpu = static_cast<int>(micro);
  cfg->gradient_accumulation_steps = static_cast<int>(accum);
  cfg->train_batch_size = product;
  cfg->micro_batch_given = cfg->accumulation_given = true;
  return absl::OkStatus();
}

}  // namespace strata::engine
