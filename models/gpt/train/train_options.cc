#include "models/gpt/train/train_options.h"

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/gpt/train/model_flags.h"
#include "runtime/base/input_file.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace strata::tools {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

// Flags that map one to one onto a config key.
const std::pair<const char*, const char*> kConfigFlags[] = {
    {"stage", "zero_optimization.stage"},
    {"micro-batch", "train_micro_batch_size_per_gpu"},
    {"grad-accum", "gradient_accumulation_steps"},
    {"lr", "optimizer.params.lr"},
    {"eps", "optimizer.params.eps"},
    {"weight-decay", "optimizer.params.weight_decay"},
    {"grad-clip", "gradient_clipping"},
    {"seed", "strata.seed"},
    {"max-live-units", "strata.max_live_units"},
    {"prefetch", "strata.prefetch_depth"},
    {"offload-params", "zero_optimization.offload_param.device"},
    {"offload-optimizer", "zero_optimization.offload_optimizer.device"},
    {"device-budget", "strata.device_budget"},
    {"host-budget", "strata.host_budget"},
    {"optimizer-threads", "strata.optimizer_threads"},
    {"shard-group-size", "zero_optimization.shard_group_size"},
};

absl::StatusOr<std::vector<std::string>> Overrides(const spec::Flags& f, const std::string& text) {
  std::vector<std::string> o;
  for (const auto& [flag, key] : kConfigFlags) {
    if (f.Has(flag)) o.push_back(absl::StrCat(key, "=", f.Str(flag)));
  }
  if (f.Has("collective-timeout")) {
    STRATA_ASSIGN_OR_RETURN(double secs, f.Double("collective-timeout", 60));
    if (!(secs > 0 && secs <= 1e9)) {  // the cast below would be undefined past int64 milliseconds
      return absl::InvalidArgumentError(absl::StrCat("--collective-timeout ", f.Str("collective-timeout"),
                                                     " is out of range (0, 1e9] seconds"));
    }
    o.push_back(absl::StrCat("strata.collective_timeout_ms=", static_cast<int64_t>(std::ceil(secs * 1000))));
  }
  if (f.Bool("optimizer-in-backward")) o.push_back("strata.optimizer_in_backward=true");
  if (f.Has("nvme-path")) {
    for (const char* which : {"offload_param", "offload_optimizer"}) {
      o.push_back(absl::StrCat("zero_optimization.", which, ".nvme_path=", f.Str("nvme-path")));
    }
  }
  const std::string dtype = f.Str("param-dtype");
  if (dtype == "fp32") {
    o.insert(o.end(), {"bf16.enabled=false", "fp16.enabled=false", "strata.param_dtype=fp32"});
  } else if (dtype == "bf16") {
    o.insert(o.end(), {"fp16.enabled=false", "bf16.enabled=true", "strata.param_dtype=bf16"});
  } else if (dtype == "fp16") {
    o.insert(o.end(), {"bf16.enabled=false", "fp16.enabled=true", "strata.param_dtype=fp16"});
  } else if (!dtype.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--param-dtype '", dtype, "': use fp32, bf16 or fp16"));
  }
  if (f.Has("beta1") || f.Has("beta2")) {
    STRATA_ASSIGN_OR_RETURN(engine::EngineConfig base, engine::ParseConfigWithOverrides(text, o));
    STRATA_ASSIGN_OR_RETURN(double b1, f.Double("beta1", base.optimizer.beta1));
    STRATA_ASSIGN_OR_RETURN(double b2, f.Double("beta2", base.optimizer.beta2));
    o.push_back(absl::StrCat("optimizer.params.betas=[", b1, ",", b2, "]"));
  }
  return o;
}

// A config error about a key that a flag set also names the flag ("--micro-batch: config key ...").
absl::Status NameTheFlag(const spec::Flags& f, const absl::Status& s) {
  for (const auto& [flag, key] : kConfigFlags) {
    if (f.Has(flag) && absl::StrContains(s.message(), absl::StrCat("'", key, "'"))) {
      return Annotate(s, absl::StrCat("--", flag));
    }
  }
  return s;
}

absl::Status ApplySchedule(const spec::Flags& f, int64_t steps, engine::EngineConfig* c) {
  if (!f.Has("lr-schedule") && !f.Has("warmup") && !f.Has("min-lr")) return absl::OkStatus();
  const std::string kind = f.Str("lr-schedule", "cosine");
  if (kind == "cosine") c->scheduler.type = engine::LrScheduleType::kWarmupCosine;
  else if (kind == "linear") c->scheduler.type = engine::LrScheduleType::kWarmupLinear;
  else if (kind == "constant") c->scheduler.type = engine::LrScheduleType::kWarmupLinear;
  else return absl::InvalidArgumentError(absl::StrCat("--lr-schedule '", kind, "': use cosine, linear or constant"));
  STRATA_ASSIGN_OR_RETURN(c->scheduler.warmup_steps, f.Int("warmup", 0));
  STRATA_ASSIGN_OR_RETURN(c->scheduler.min_lr, f.Double("min-lr", 0.0));
  if (c->scheduler.warmup_steps < 0) return absl::InvalidArgumentError("--warmup must be >= 0 steps");
  if (c->scheduler.min_lr < 0 || c->scheduler.min_lr > c->optimizer.lr) {
    return absl::InvalidArgumentError(absl::StrCat("--min-lr ", c->scheduler.min_lr, " must be in [0, lr=",
                                                   c->optimizer.lr, "]"));
  }
  c->scheduler.warmup_min_lr = 0;
  c->scheduler.total_steps = kind == "constant" ? 0 : steps;
  return absl::OkStatus();
}

// --lr-scaling linear|sqrt: lr x (global batch / base batch) or its square root, the usual rule when
// adding ranks; the warm-up then ramps to the scaled rate.
absl::Status ApplyLrScaling(const spec::Flags& f, int world, engine::EngineConfig* c) {
  const std::string mode = f.Str("lr-scaling", "none");
  if (mode == "none") return absl::OkStatus();
  if (mode != "linear" && mode != "sqrt") {
    return absl::InvalidArgumentError(absl::StrCat("--lr-scaling '", mode, "': use none, linear or sqrt"));
  }
  STRATA_ASSIGN_OR_RETURN(int64_t base, f.Int("base-batch", 0));
  if (base < 1) return absl::InvalidArgumentError("--lr-scaling needs --base-batch B >= 1 (sequences)");
  const double global = double(c->train_micro_batch_size_per_gpu) * c->gradient_accumulation_steps * world;
  const double factor = mode == "linear" ? global / base : std::sqrt(global / base);
  c->optimizer.lr *= factor;
  c->scheduler.min_lr *= factor;
  STRATA_LOG(Info) << "lr scaling " << mode << ": global batch " << global << " / base " << base << " -> lr x" << factor
                   << " = " << c->optimizer.lr;
  return absl::OkStatus();
}

// Without --config, the flags' own defaults (--help, docs/configuration.md): stage 3, an fp16 scale that
// halves on the first overflow, weight decay on the 2-D weights only. With --config, a key the file leaves out
// has DeepSpeed's default (Note [Two sets of defaults], runtime/engine/config.h).
constexpr char kFlagDefaults[] =
    R"({"zero_optimization": {"stage": 3}, "fp16": {"hysteresis": 1}, "strata": {"weight_decay_1d": false}})";

absl::StatusOr<std::string> ReadConfigText(const spec::Flags& f) {
  if (!f.Has("config")) return std::string(kFlagDefaults);
  auto text = ReadConfigFile(f.Str("config"));
  if (!text.ok()) return Annotate(text.status(), "--config");
  return text;
}

}  // namespace

std::vector<spec::FlagDef> TrainFlagDefs() {
  std::vector<spec::FlagDef> d = {{"help", true, "print this list and exit"}};
  const std::vector<spec::FlagDef> model = ModelFlagDefs();
  d.insert(d.end(), model.begin(), model.end());
  const std::vector<spec::FlagDef> more = {
      {"config", false, "JSON config (DeepSpeed keys + \"strata\"); flags override it"},
      {"stage", false, "ZeRO stage 0-3 (default 3; with --config, the file's, DeepSpeed's 0 when absent)"},
      {"micro-batch", false, "sequences per rank per micro-batch"},
      {"grad-accum", false, "micro-batches per step"},
      {"steps", false, "optimizer steps (default 200)"},
      {"lr", false, "peak learning rate"},
      {"warmup", false, "warm-up steps"},
      {"lr-schedule", false, "cosine | linear | constant (after warm-up)"},
      {"min-lr", false, "floor of the decay"},
      {"lr-scaling", false, "none | linear | sqrt: scale lr by global batch / --base-batch"},
      {"base-batch", false, "the global batch (sequences) the lr was tuned for"},
      {"beta1", false, "AdamW beta1"},
      {"beta2", false, "AdamW beta2"},
      {"eps", false, "AdamW epsilon"},
      {"weight-decay", false, "decoupled weight decay (2-D weights only, unless --config: every parameter)"},
      {"grad-clip", false, "global gradient-norm clip (0 = off)"},
      {"seed", false, "initialisation and data-order seed"},
      {"param-dtype", false, "fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)"},
      {"activation-checkpointing", true, "recompute each block's activations in backward"},
      {"device", false, "cuda | host | auto (default: cuda when built with CUDA and a GPU is visible)"},
      {"matmul", false,
       "auto | fp32 | tf32 | bf16: matrix products on the GPU (auto: bf16 with bf16 params, else fp32)"},
      {"tf32", true, "the same as --matmul tf32"},
      {"attention", false,
       "auto | fused | reference: cuDNN's fused attention or the plain kernel (auto: fused with bf16 products)"},
      {"data", false, "llm.c token file or text file (default: the embedded corpus)"},
      {"data-order", false, "shuffled (default) | sequential"},
      {"init-from", false, "initial weights: a .safetensors file or a Hugging Face directory (GPT-2 names)"},
      {"save-weights", false, "write consolidated weights at the end (.safetensors)"},
      {"metrics", false, "JSON lines, one per step"},
      {"print-every", false, "progress line every N steps (default 1)"},
      {"trace", false, "write a Chrome trace (chrome://tracing, Perfetto) of every rank and stream"},
      {"diagnostics-window", false, "steps over which bottleneck diagnostics are judged (default 20; 0 = off)"},
      {"checkpoint-dir", false, "write sharded checkpoints under this directory (step_NNNNNNNN/)"},
      {"checkpoint-every", false, "steps between checkpoints (default: only at the end)"},
      {"keep-last", false, "complete checkpoints to keep (default: all)"},
      {"checkpoint-async", true, "write checkpoints in the background while training goes on"},
      {"resume", false, "continue from a step directory, or the latest complete one under a directory"},
      {"max-live-units", false, "gathered units held at once (stage 3)"},
      {"offload-params", false, "none | cpu | nvme: where parameter shards live (stage 3)"},
      {"offload-optimizer", false, "none | cpu | nvme: where master weights and optimizer state live"},
      {"nvme-path", false, "directory for NVMe-offloaded state"},
      {"optimizer-in-backward", true,
       "each unit's update runs in backward as its gradient is reduced, so no gradient is kept (stages 2-3; no "
       "accumulation, clipping or fp16)"},
      {"device-budget", false, "bytes of the device tier (e.g. 512MiB); host memory on host builds"},
      {"host-budget", false, "bytes of pinned host memory"},
      {"prefetch", false, "units gathered ahead"},
      {"shard-group-size", false, "ranks per shard group (a divisor of the world, or node); replicated across groups"},
      {"optimizer-threads", false,
       "threads of the host optimizer update (default 0: the CPUs this rank may use, at most 64)"},
      {"collective-timeout", false, "seconds before a stuck collective fails the job (default 60)"},
      {"loader-delay-us", false, "testing: slow the data loader by this much per batch"},
      {"inject-nonfinite-step", false, "testing: NaN gradients at this step (0-based) on --inject-nonfinite-rank"},
      {"inject-nonfinite-rank", false, "testing: the rank that gets NaN gradients"},
  };
  d.insert(d.end(), more.begin(), more.end());
  return d;
}

absl::StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args, int world_size) {
  const std::vector<spec::FlagDef> defs = TrainFlagDefs();
  STRATA_ASSIGN_OR_RETURN(spec::Flags f, spec::Flags::Parse(args, defs));
  if (!f.positional().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f.positional()[0], "'\n",
                                                   spec::Flags::Usage("train", defs)));
  }
  TrainOptions o;
  STRATA_ASSIGN_OR_RETURN(o.model, ModelFromFlags(f));
  STRATA_ASSIGN_OR_RETURN(o.steps, f.Int("steps", 200));
  if (o.steps < 0) return absl::InvalidArgumentError("--steps must be >= 0");
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadConfigText(f));
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> overrides, Overrides(f, text));
  engine::ConfigFacts facts;  // Note ["auto"], runtime/engine/config_deepspeed.h
  facts.world_size = world_size;
  facts.hidden_size = o.model.d_model;
  facts.total_steps = o.steps;
  auto engine = engine::ParseConfigWithOverrides(text, overrides, facts);
  if (!engine.ok()) return NameTheFlag(f, engine.status());
  o.engine = *std::move(engine);
  STRATA_RETURN_IF_ERROR(ApplySchedule(f, o.steps, &o.engine));
  STRATA_RETURN_IF_ERROR(ApplyLrScaling(f, world_size, &o.engine));
  o.data = f.Str("data");
  const std::string order = f.Str("data-order", "shuffled");
  if (order != "shuffled" && order != "sequential") {
    return absl::InvalidArgumentError(absl::StrCat("--data-order '", order, "': use shuffled or sequential"));
  }
  o.order = order == "shuffled" ? gpt::DataOrder::kShuffled : gpt::DataOrder::kSequential;
  o.init_from = f.Str("init-from");
  o.save_weights = f.Str("save-weights");
  o.metrics = f.Str("metrics");
  o.checkpointing = f.Bool("activation-checkpointing");
  o.device = f.Str("device", "auto");
  if (o.device != "cuda" && o.device != "host" && o.device != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--device '", o.device, "': use cuda, host or auto"));
  }
  const std::string matmul = f.Str("matmul", f.Bool("tf32") ? "tf32" : "auto");
  if (f.Bool("tf32") && matmul != "tf32") {
    return absl::InvalidArgumentError(absl::StrCat("--tf32 and --matmul ", matmul, " disagree"));
  }
  if (matmul != "auto") {
    STRATA_ASSIGN_OR_RETURN(o.matmul, gpt::ParseProducts(matmul));
  }
  STRATA_ASSIGN_OR_RETURN(o.attention, gpt::ParseAttention(f.Str("attention", "auto")));
  o.checkpoint_dir = f.Str("checkpoint-dir");
  o.trace = f.Str("trace");
  STRATA_ASSIGN_OR_RETURN(int64_t window, f.Int("diagnostics-window", 20));
  if (window < 0 || window > 100000) return absl::InvalidArgumentError("--diagnostics-window must be in [0, 100000]");
  o.diagnostics_window = static_cast<int>(window);
  o.resume = f.Str("resume");
  STRATA_ASSIGN_OR_RETURN(o.checkpoint_every, f.Int("checkpoint-every", 0));
  STRATA_ASSIGN_OR_RETURN(o.keep_last, f.Int("keep-last", 0));
  if (o.checkpoint_every < 0 || o.keep_last < 0) {
    return absl::InvalidArgumentError("--checkpoint-every and --keep-last must be >= 0");
  }
  o.checkpoint_async = f.Bool("checkpoint-async");
  if ((o.checkpoint_every > 0 || o.keep_last > 0 || o.checkpoint_async) && o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint-every / --keep-last / --checkpoint-async need --checkpoint-dir");
  }
  STRATA_ASSIGN_OR_RETURN(o.print_every, f.Int("print-every", 1));
  if (o.print_every < 1) return absl::InvalidArgumentError("--print-every must be >= 1");
  STRATA_ASSIGN_OR_RETURN(o.loader_delay_us, f.IntIn("loader-delay-us", 0, 0, 60000000));
  STRATA_ASSIGN_OR_RETURN(o.inject_nonfinite_step, f.Int("inject-nonfinite-step", -1));
  STRATA_ASSIGN_OR_RETURN(int64_t inject_rank, f.IntIn("inject-nonfinite-rank", 0, 0, kMaxInt));
  o.inject_nonfinite_rank = static_cast<int>(inject_rank);
  return o;
}

}  // namespace strata::tools
