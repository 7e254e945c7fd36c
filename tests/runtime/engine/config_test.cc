// Tests for runtime/engine/config: defaults, the DeepSpeed key mapping, every validation rule, the
// "did you mean" messages, overrides and file loading.
#include "runtime/engine/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Expects `text` to be rejected with InvalidArgument whose message contains every fragment.
void ExpectInvalid(const std::string& text, const std::vector<std::string>& fragments) {
  auto cfg = ParseConfig(text);
  ASSERT_FALSE(cfg.ok()) << "accepted: " << text;
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << cfg.status();
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(fragment)) << "config: " << text;
  }
}

EngineConfig ParseOk(const std::string& text) {
  auto cfg = ParseConfig(text);
  EXPECT_TRUE(cfg.ok()) << cfg.status() << "\nconfig: " << text;
  return cfg.ok() ? *cfg : EngineConfig{};
}

// A JSON config's defaults are DeepSpeed's (Note [Two sets of defaults]): stage 0 without zero_optimization.
TEST(Config, EmptyObjectKeepsDefaults) {
  const EngineConfig cfg = ParseOk("{}");
  const EngineConfig def;
  EXPECT_EQ(cfg.stage, 0);
  EXPECT_EQ(def.stage, 3);  // the C++ API's default stays
  EXPECT_TRUE(cfg.weight_decay_1d);
  EXPECT_FALSE(def.weight_decay_1d);
  EXPECT_EQ(cfg.fp16.hysteresis, 2);
  EXPECT_FALSE(cfg.fp16.consecutive_hysteresis);
  EXPECT_TRUE(cfg.optimizer.adam_w_mode);
  EXPECT_EQ(cfg.train_batch_size, 0);
  EXPECT_EQ(cfg.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(cfg.gradient_accumulation_steps, 1);
  EXPECT_EQ(cfg.gradient_clipping, 0.0);
  EXPECT_FALSE(cfg.bf16);
  EXPECT_FALSE(cfg.fp16.enabled);
  EXPECT_EQ(cfg.optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(cfg.optimizer.lr, def.optimizer.lr);
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kConstant);
  EXPECT_EQ(cfg.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(cfg.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(cfg.param_dtype, DType::kF32);
  EXPECT_EQ(cfg.reduce_dtype, DType::kF32);
  EXPECT_EQ(cfg.max_live_units, 2);
  EXPECT_EQ(cfg.prefetch_depth, 1);
  EXPECT_TRUE(cfg.reshard_after_forward);
  EXPECT_EQ(cfg.collective_timeout_ms, 60000);
  EXPECT_EQ(cfg.seed, 1u);
  EXPECT_EQ(cfg.device_budget_bytes, ~uint64_t{0});
  EXPECT_EQ(cfg.host_budget_bytes, ~uint64_t{0});
  EXPECT_EQ(cfg.optimizer_threads, 0);
}

constexpr char kFullConfig[] = R"({
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW",
                "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 6e-4, "warmup_num_steps": 100,
                           "total_num_steps": 1e4, "warmup_type": "linear"}},
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": false,
                      "buffer_count": 5, "buffer_size": 1e8},
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
    "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "allgather_partitions": true,
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": 1e6,
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9, "sub_group_size": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true, "round_robin_gradients": {"any": "thing"}
  },
  "strata": {"param_dtype": "bf16", "reduce_dtype": "bf16", "max_live_units": 3, "prefetch_depth": 2,
             "reshard_after_forward": false, "collective_timeout_ms": 30000, "seed": 18446744073709551615,
             "device_budget": "512MiB", "host_budget": 1073741824, "optimizer_threads": 6}
})";

TEST(Config, FullDeepSpeedExampleFillsTheStruct) {
  const EngineConfig cfg = ParseOk(kFullConfig);
  EXPECT_EQ(cfg.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(cfg.gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(cfg.gradient_clipping, 1.0);
  EXPECT_TRUE(cfg.bf16);
  EXPECT_FALSE(cfg.fp16.enabled);
  EXPECT_EQ(cfg.param_dtype, DType::kBF16);
  EXPECT_EQ(cfg.reduce_dtype, DType::kBF16);
  EXPECT_EQ(cfg.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 6e-4);  // warmup_max_lr overrides the optimizer's lr
  EXPECT_DOUBLE_EQ(cfg.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(cfg.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(cfg.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(cfg.optimizer.weight_decay, 0.1);
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kWarmupDecayLR);
  EXPECT_FALSE(cfg.scheduler.log_warmup);
  EXPECT_EQ(cfg.train_batch_size, 64);
  EXPECT_EQ(cfg.scheduler.warmup_steps, 100);
  EXPECT_EQ(cfg.scheduler.total_steps, 10000);
  EXPECT_DOUBLE_EQ(cfg.scheduler.warmup_min_lr, 1e-5);
  EXPECT_DOUBLE_EQ(cfg.scheduler.min_lr, 1e-5);
  EXPECT_EQ(cfg.stage, 3);
  EXPECT_EQ(cfg.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(cfg.offload_param.nvme_path, "/local_nvme");
  EXPECT_FALSE(cfg.offload_param.pin_memory);
  EXPECT_EQ(cfg.offload_param.buffer_count, 5);
  EXPECT_EQ(cfg.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(cfg.offload_optimizer.pin_memory);
  EXPECT_EQ(cfg.max_live_units, 3);
  EXPECT_EQ(cfg.prefetch_depth, 2);
  EXPECT_FALSE(cfg.reshard_after_forward);
  EXPECT_EQ(cfg.collective_timeout_ms, 30000);
  EXPECT_EQ(cfg.seed, ~uint64_t{0});
  EXPECT_EQ(cfg.device_budget_bytes, 512ull << 20);
  EXPECT_EQ(cfg.host_budget_bytes, 1ull << 30);
  EXPECT_EQ(cfg.optimizer_threads, 6);
}

TEST(Config, Fp16BlockSetsLossScaling) {
  const EngineConfig cfg = ParseOk(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 500, "hysteresis": 4, "consecutive_hysteresis": true, "min_loss_scale": 0.5}})");
  EXPECT_EQ(cfg.fp16.hysteresis, 4);
  EXPECT_TRUE(cfg.fp16.consecutive_hysteresis);
  EXPECT_TRUE(cfg.fp16.enabled);
  EXPECT_FALSE(cfg.bf16);
  EXPECT_EQ(cfg.param_dtype, DType::kF16);
  EXPECT_EQ(cfg.fp16.static_loss_scale, 0);
  EXPECT_EQ(cfg.fp16.initial_scale_power, 12);
  EXPECT_EQ(cfg.fp16.loss_scale_window, 500);
  EXPECT_EQ(cfg.fp16.min_loss_scale, 0.5);
}

TEST(Config, OptimizerTypesAreCaseInsensitiveAndAdamMeansAdamW) {
  EXPECT_EQ(ParseOk(R"({"optimizer": {"type": "adam"}})").optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(ParseOk(R"({"optimizer": {"type": "ADAMW"}})").optimizer.type, OptimizerType::kAdamW);
  const EngineConfig sgd =
      ParseOk(R"({"optimizer": {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}}})");
  EXPECT_EQ(sgd.optimizer.type, OptimizerType::kSgd);
  EXPECT_DOUBLE_EQ(sgd.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(sgd.optimizer.momentum, 0.9);
  ExpectInvalid(R"({"optimizer": {"type": "Lamb"}})", {"optimizer.type", "Lamb", "AdamW"});
}

TEST(Config, OptimizerParamsOnlyForTheirOptimizer) {
  ExpectInvalid(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})",
                {"optimizer.params.momentum", "SGD"});
  ExpectInvalid(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
                {"optimizer.params.betas", "Adam"});
  ExpectInvalid(R"({"optimizer": {"type": "SGD", "params": {"eps": 1e-8}}})", {"optimizer.params.eps"});
}

TEST(Config, WarmupLRWarmsUpThenStaysConstant) {
  const EngineConfig cfg = ParseOk(R"({"optimizer": {"params": {"lr": 1e-3}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_num_steps": 50}}})");
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kWarmupLR);
  EXPECT_TRUE(cfg.scheduler.log_warmup);  // DeepSpeed's default warmup_type
  EXPECT_EQ(cfg.scheduler.warmup_steps, 50);
  EXPECT_EQ(cfg.scheduler.total_steps, 0);
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 1e-3);
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})",
                {"scheduler.params.total_num_steps", "WarmupLR"});
}

TEST(Config, WarmupLRDefaultsToDeepSpeedWarmupSteps) {
  EXPECT_EQ(ParseOk(R"({"scheduler": {"type": "WarmupLR"}})").scheduler.warmup_steps, 1000);
}

TEST(Config, WarmupDecayLRNeedsAHorizonPastTheWarmup) {
  const EngineConfig cfg = ParseOk(R"({"scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_num_steps": 10, "total_num_steps": 100}}})");
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kWarmupDecayLR);
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 0.001);  // DeepSpeed's warmup_max_lr default for WarmupDecayLR
  EXPECT_EQ(cfg.scheduler.total_steps, 100);
  ExpectInvalid(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
                {"scheduler.params.total_num_steps", "required"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupDecayLR",
                    "params": {"warmup_num_steps": 10, "total_num_steps": 10}}})",
                {"scheduler.params.total_num_steps", "warmup_num_steps"});
}

TEST(Config, WarmupCosineLRSetsTheFloorFromTheRatio) {
  const EngineConfig cfg = ParseOk(R"({"optimizer": {"params": {"lr": 2e-4}},
      "scheduler": {"type": "WarmupCosineLR",
                    "params": {"warmup_num_steps": 20, "total_num_steps": 200, "cos_min_ratio": 0.1}}})");
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kWarmupCosineLR);
  EXPECT_EQ(cfg.scheduler.warmup_steps, 20);
  EXPECT_EQ(cfg.scheduler.total_steps, 200);
  EXPECT_DOUBLE_EQ(cfg.scheduler.min_lr, 2e-5);
  ExpectInvalid(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 1}}})",
                {"scheduler.params.total_num_steps", "required"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})",
                {"scheduler.params.cos_min_ratio"});
}

TEST(Config, ConstantSchedulerTakesNoParams) {
  EXPECT_EQ(ParseOk(R"({"scheduler": {"type": "constant"}})").scheduler.type, LrScheduleType::kConstant);
  ExpectInvalid(R"({"scheduler": {"type": "constant", "params": {"warmup_num_steps": 5}}})",
                {"scheduler.params.warmup_num_steps", "constant"});
}

TEST(Config, SchedulerRejectsUnsupportedTypesAndWarmupShapes) {
  ExpectInvalid(R"({"scheduler": {"type": "OneCycle"}})", {"scheduler.type", "OneCycle", "WarmupLR"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})",
                {"scheduler.params.warmup_type", "'log'", "'linear'"});
  ExpectInvalid(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1, "warmup_max_lr": 0.1}}})",
      {"scheduler.params.warmup_min_lr", "peak lr"});
}

TEST(Config, UnknownTopLevelKeySuggestsTheNearest) {
  ExpectInvalid(R"({"gradient_clip": 1.0})",
                {"unknown config key 'gradient_clip'", "did you mean 'gradient_clipping'?"});
  ExpectInvalid(R"({"optimiser": {}})", {"did you mean 'optimizer'?"});
}

TEST(Config, UnknownNestedKeySuggestsTheNearestWithItsPath) {
  ExpectInvalid(R"({"zero_optimization": {"stag": 2}})",
                {"unknown config key 'zero_optimization.stag'; did you mean 'zero_optimization.stage'?"});
  ExpectInvalid(R"({"zero_optimization": {"offload_param": {"devcie": "cpu"}}})",
                {"did you mean 'zero_optimization.offload_param.device'?"});
  ExpectInvalid(R"({"optimizer": {"params": {"betas1": 0.9}}})", {"did you mean 'optimizer.params.betas'?"});
  ExpectInvalid(R"({"strata": {"max_live_unit": 2}})", {"did you mean 'strata.max_live_units'?"});
}

TEST(Config, UnknownKeyFarFromAllListsTheValidKeys) {
  ExpectInvalid(R"({"strata": {"zzzzzzzzzzzz": 1}})",
                {"unknown config key 'strata.zzzzzzzzzzzz'", "max_live_units", "host_budget"});
}

TEST(Config, TypeErrorsNameThePathAndTheExpectedType) {
  ExpectInvalid(R"({"zero_optimization": {"stage": "3"}})",
                {"zero_optimization.stage", "an integer", "string"});
  ExpectInvalid(R"({"zero_optimization": {"stage": 2.5}})", {"zero_optimization.stage", "an integer"});
  ExpectInvalid(R"({"gradient_clipping": "1.0"})", {"gradient_clipping", "a number"});
  ExpectInvalid(R"({"bf16": {"enabled": "yes"}})", {"bf16.enabled", "a boolean"});
  ExpectInvalid(R"({"bf16": true})", {"'bf16'", "an object"});
  ExpectInvalid(R"({"optimizer": {"type": 3}})", {"optimizer.type", "a string"});
  ExpectInvalid(R"({"optimizer": {"params": {"betas": 0.9}}})",
                {"optimizer.params.betas", "array of 2 numbers"});
  ExpectInvalid(R"({"strata": {"seed": -1}})", {"strata.seed", ">= 0"});
  ExpectInvalid(R"({"strata": {"device_budget": true}})", {"strata.device_budget", "512MiB"});
  ExpectInvalid(R"([1, 2])", {"config must be a JSON object"});
}

TEST(Config, IntegerKeysAcceptIntegralFloats) {
  EXPECT_EQ(ParseOk(R"({"zero_optimization": {"stage": 2.0}})").stage, 2);
}

TEST(Config, IgnoredKeysAcceptAnyType) {
  ParseOk(R"({"steps_per_print": "x", "wall_clock_breakdown": [1],
              "zero_optimization": {"overlap_comm": {"a": 1}, "reduce_bucket_size": "auto"}})");
}

TEST(Config, RangeChecksNameTheKeyValueAndRange) {
  ExpectInvalid(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "is 4", "[0, 3]"});
  ExpectInvalid(R"({"zero_optimization": {"stage": -1}})", {"zero_optimization.stage", "[0, 3]"});
  ExpectInvalid(R"({"optimizer": {"params": {"lr": 0}}})", {"optimizer.params.lr", "is 0", "> 0"});
  ExpectInvalid(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})",
                {"optimizer.params.betas[1]", "1.0", "[0, 1)"});
  ExpectInvalid(R"({"optimizer": {"params": {"eps": 0}}})", {"optimizer.params.eps", "> 0"});
  ExpectInvalid(R"({"optimizer": {"params": {"weight_decay": -0.1}}})",
                {"optimizer.params.weight_decay", ">= 0"});
  ExpectInvalid(R"({"optimizer": {"type": "SGD", "params": {"momentum": 1}}})",
                {"optimizer.params.momentum", "[0, 1)"});
  ExpectInvalid(R"({"strata": {"max_live_units": 0}})", {"strata.max_live_units", "is 0", ">= 1"});
  ExpectInvalid(R"({"strata": {"prefetch_depth": -1}})", {"strata.prefetch_depth", ">= 0"});
  ExpectInvalid(R"({"strata": {"collective_timeout_ms": 0}})", {"strata.collective_timeout_ms", ">= 1"});
  ExpectInvalid(R"({"strata": {"optimizer_threads": -1}})", {"strata.optimizer_threads", "in [0, 256]"});
  ExpectInvalid(R"({"strata": {"optimizer_threads": 257}})", {"strata.optimizer_threads", "in [0, 256]"});
  ExpectInvalid(R"({"strata": {"optimizer_threads": 2.5}})", {"strata.optimizer_threads"});
  ExpectInvalid(R"({"strata": {"optimizer_threads": "4"}})", {"strata.optimizer_threads"});
  ExpectInvalid(R"({"train_micro_batch_size_per_gpu": 0})", {"train_micro_batch_size_per_gpu", ">= 1"});
  ExpectInvalid(R"({"gradient_accumulation_steps": 0})", {"gradient_accumulation_steps", ">= 1"});
  ExpectInvalid(R"({"gradient_accumulation_steps": 3000000000})",
                {"gradient_accumulation_steps", "<= 2147483647"});
  ExpectInvalid(R"({"gradient_clipping": -1})", {"gradient_clipping", "is -1", ">= 0"});
  ExpectInvalid(R"({"train_batch_size": 0})", {"train_batch_size", ">= 1"});
  ExpectInvalid(R"({"fp16": {"loss_scale_window": 0}})", {"fp16.loss_scale_window", ">= 1"});
  ExpectInvalid(R"({"fp16": {"min_loss_scale": 0}})", {"fp16.min_loss_scale", "> 0"});
  ExpectInvalid(R"({"fp16": {"loss_scale": -1}})", {"fp16.loss_scale", ">= 0"});
  ExpectInvalid(R"({"fp16": {"initial_scale_power": 200}})", {"fp16.initial_scale_power", "[0, 127]"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}})",
                {"scheduler.params.warmup_num_steps", ">= 1"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000,
                    "cos_min_ratio": 1.5}}})",
                {"scheduler.params.cos_min_ratio", "[0, 1]"});
  ExpectInvalid(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "buffer_count": 0}}})",
                {"zero_optimization.offload_optimizer.buffer_count", ">= 1"});
}

TEST(Config, OffloadDevicesAndTheirRequirements) {
  ExpectInvalid(R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})",
                {"zero_optimization.offload_param.nvme_path", "nvme"});
  ExpectInvalid(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": ""}}})",
                {"zero_optimization.offload_optimizer.nvme_path"});
  ExpectInvalid(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})",
                {"zero_optimization.offload_param.device", "gpu", "cpu"});
  ExpectInvalid(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
                {"zero_optimization.offload_param", "stage 3"});
  ExpectInvalid(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
                {"zero_optimization.offload_optimizer", "stage 1"});
  const EngineConfig cfg = ParseOk(R"({"zero_optimization": {"stage": 2,
      "offload_param": {"device": "none"}, "offload_optimizer": {"device": "CPU"}}})");
  EXPECT_EQ(cfg.offload_optimizer.device, OffloadDevice::kCpu);
}

TEST(Config, ShardGroupSizeIsAPositiveIntegerOrNodeAtStagesOneToThree) {
  EXPECT_EQ(ParseOk("{}").shard_group_size, kShardGroupWorld);
  EXPECT_EQ(ParseOk(R"({"zero_optimization": {"stage": 3, "shard_group_size": 2}})").shard_group_size, 2);
  EXPECT_EQ(ParseOk(R"({"zero_optimization": {"stage": 2, "shard_group_size": "node"}})").shard_group_size,
            kShardGroupNode);
  EXPECT_EQ(ParseOk(R"({"zero_optimization": {"stage": 1, "shard_group_size": 1}})").shard_group_size, 1);
  ExpectInvalid(R"({"zero_optimization": {"shard_group_size": 0}})", {"zero_optimization.shard_group_size", ">= 1"});
  ExpectInvalid(R"({"zero_optimization": {"shard_group_size": "host"}})",
                {"zero_optimization.shard_group_size", "\"node\""});
  ExpectInvalid(R"({"zero_optimization": {"stage": 0, "shard_group_size": 2}})",
                {"zero_optimization.shard_group_size", "stage 0 shards nothing"});
  auto over = ParseConfigWithOverrides("{}", {"zero_optimization.stage=3", "zero_optimization.shard_group_size=node"});
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->shard_group_size, kShardGroupNode);
}

TEST(Config, PrecisionBlocksMustAgree) {
  ExpectInvalid(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})",
                {"bf16.enabled", "fp16.enabled"});
  ExpectInvalid(R"({"bf16": {"enabled": true}, "strata": {"param_dtype": "fp32"}})",
                {"strata.param_dtype", "bf16.enabled=true"});
  ExpectInvalid(R"({"bf16": {"enabled": false}, "strata": {"param_dtype": "bf16"}})",
                {"strata.param_dtype", "bf16.enabled=false"});
  ExpectInvalid(R"({"strata": {"param_dtype": "fp16"}})", {"strata.param_dtype", "fp16.enabled"});
  ExpectInvalid(R"({"strata": {"param_dtype": "fp8"}})", {"strata.param_dtype", "fp8"});
  ExpectInvalid(R"({"strata": {"reduce_dtype": "fp16"}})", {"strata.reduce_dtype", "fp32"});
  const EngineConfig bf16 = ParseOk(R"({"strata": {"param_dtype": "bf16"}})");
  EXPECT_EQ(bf16.param_dtype, DType::kBF16);
  EXPECT_TRUE(bf16.bf16);
  EXPECT_EQ(ParseOk(R"({"bf16": {"enabled": false}})").param_dtype, DType::kF32);
}

TEST(Config, BudgetsAcceptSizeStringsAndNumbers) {
  EXPECT_EQ(ParseOk(R"({"strata": {"device_budget": "512MiB"}})").device_budget_bytes, 512ull << 20);
  EXPECT_EQ(ParseOk(R"({"strata": {"host_budget": "2GB"}})").host_budget_bytes, 2000000000ull);
  EXPECT_EQ(ParseOk(R"({"strata": {"device_budget": 4096}})").device_budget_bytes, 4096u);
  EXPECT_EQ(ParseOk(R"({"strata": {"host_budget": 1.5e9}})").host_budget_bytes, 1500000000ull);
  ExpectInvalid(R"({"strata": {"device_budget": "12 parsecs"}})", {"strata.device_budget", "parsecs"});
  ExpectInvalid(R"({"strata": {"host_budget": -1}})", {"strata.host_budget", ">= 0"});
  ExpectInvalid(R"({"strata": {"host_budget": 0}})", {"strata.host_budget", ">= 1"});
}

TEST(Config, MalformedJsonReportsThePosition) {
  ExpectInvalid("{\n  \"zero_optimization\": {\"stage\": 2,}\n}", {"malformed config JSON", "line 2"});
  ExpectInvalid("", {"malformed config JSON"});
}

TEST(Config, DuplicateKeysAreRejected) {
  ExpectInvalid(R"({"optimizer": {"params": {"lr": 1e-3, "lr": 2e-3}}})",
                {"duplicate config key 'optimizer.params.lr'"});
}

// A config nested 100k deep once grew the duplicate-key finder's memory quadratically and crashed.
TEST(Config, DeepNestingIsRefusedBeforeParsing) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"strata\":";
  deep += "1" + std::string(100000, '}');
  ExpectInvalid(deep, {"config JSON nests deeper than 64 levels"});
  ExpectInvalid("{\"strata\": " + std::string(100000, '[') + std::string(100000, ']') + "}", {"nests deeper than 64"});
  auto over = ParseConfigWithOverrides("{}", {"strata.seed=" + std::string(100000, '[') + std::string(100000, ']')});
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("config override JSON nests deeper than 64"));
  std::string long_path = "a";
  for (int i = 0; i < 100000; ++i) long_path += ".a";
  auto path = ParseConfigWithOverrides("{}", {long_path + "=1"});
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(std::string(path.status().message()), HasSubstr("parts; at most 64"));
}

// An override's text that is not JSON becomes a string; bytes that are not UTF-8 once made the error
// message's dump() throw into the bug guard (Internal). tests/fuzz/regressions/config.
TEST(Config, AnOverrideValueThatIsNotUtf8IsAnInvalidArgument) {
  auto cfg = ParseConfigWithOverrides("{}", {"bf16=\x8b"});
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << cfg.status();
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("bf16"));
}

TEST(Config, DuplicateKeysInsideAnOverrideValueAreRejected) {
  auto cfg = ParseConfigWithOverrides("{}", {R"(optimizer.params={"lr": 1e-3, "lr": 2e-3})"});
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("duplicate config override key 'lr'"));
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("optimizer.params"));
}

// Integer keys are never narrowed: 2^32 + 1 once ran as a micro-batch of 1.
TEST(Config, IntegersThatDoNotFitTheirFieldAreRangeErrors) {
  ExpectInvalid(R"({"train_micro_batch_size_per_gpu": 4294967297})",
                {"train_micro_batch_size_per_gpu", "4294967297", "<= 2147483647"});
  ExpectInvalid(R"({"gradient_accumulation_steps": 4294967297})", {"gradient_accumulation_steps", "<= 2147483647"});
  ExpectInvalid(R"({"strata": {"max_live_units": 2147483648}})", {"strata.max_live_units", "<= 2147483647"});
  ExpectInvalid(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 1e12}}})",
                {"buffer_count", "<= 2147483647"});
  ExpectInvalid(R"({"fp16": {"enabled": true, "loss_scale_window": 9223372036854775807}})",
                {"fp16.loss_scale_window", "<= 2147483647"});
  // A deadline of now + 2^63 ms overflows the clocks; the timeout is bounded.
  ExpectInvalid(R"({"strata": {"collective_timeout_ms": 9223372036854775807}})",
                {"strata.collective_timeout_ms", "<= 1e12"});
  EXPECT_EQ(ParseOk(R"({"train_micro_batch_size_per_gpu": 2147483647})").train_micro_batch_size_per_gpu,
            2147483647);
}

TEST(Config, OverridesReplaceAndCreateKeys) {
  auto cfg = ParseConfigWithOverrides(
      R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}})",
      {"zero_optimization.stage=2", "strata.max_live_units=3", "optimizer.params.lr=3e-4",
       "optimizer.params.betas=[0.8,0.9]", "zero_optimization.offload_optimizer.device=nvme",
       "zero_optimization.offload_optimizer.nvme_path=/mnt/nvme0", "strata.device_budget=1GiB",
       "strata.reshard_after_forward=false"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->stage, 2);
  EXPECT_EQ(cfg->max_live_units, 3);
  EXPECT_DOUBLE_EQ(cfg->optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(cfg->optimizer.beta1, 0.8);
  EXPECT_EQ(cfg->offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(cfg->offload_optimizer.nvme_path, "/mnt/nvme0");
  EXPECT_EQ(cfg->device_budget_bytes, 1ull << 30);
  EXPECT_FALSE(cfg->reshard_after_forward);
}

TEST(Config, OverridesOnEmptyTextStartFromDefaults) {
  auto cfg = ParseConfigWithOverrides("", {"train_micro_batch_size_per_gpu=8"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->train_micro_batch_size_per_gpu, 8);
  EXPECT_TRUE(ParseConfigWithOverrides("  \n", {}).ok());
}

TEST(Config, OverridesAreValidatedLikeTheFile) {
  auto unknown = ParseConfigWithOverrides("{}", {"zero_optimization.stag=2"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("did you mean 'zero_optimization.stage'?"));

  auto range = ParseConfigWithOverrides("{}", {"zero_optimization.stage=7"});
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(std::string(range.status().message()), HasSubstr("[0, 3]"));

  auto malformed = ParseConfigWithOverrides("{}", {"no_equals_sign"});
  ASSERT_FALSE(malformed.ok());
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr("key.path=value"));

  auto through_scalar = ParseConfigWithOverrides(R"({"gradient_clipping": 1})", {"gradient_clipping.x=1"});
  ASSERT_FALSE(through_scalar.ok());
  EXPECT_THAT(std::string(through_scalar.status().message()), HasSubstr("not an object"));
}

TEST(Config, LoadConfigFileReadsAndNamesTheFile) {
  const std::string path = ::testing::TempDir() + "/strata_config_test.json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"zero_optimization": {"stage": 1}})", f);
  std::fclose(f);
  auto cfg = LoadConfigFile(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->stage, 1);

  f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"zero_optimization": {"stage": 9}})", f);
  std::fclose(f);
  auto bad = LoadConfigFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              AllOf(HasSubstr(path), HasSubstr("zero_optimization.stage")));
  std::remove(path.c_str());
}

TEST(Config, LoadConfigFileOfADirectoryNamesIt) {
  const std::string dir = ::testing::TempDir();
  auto cfg = LoadConfigFile(dir);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cfg.status().message()), AllOf(HasSubstr(dir), HasSubstr("is a directory")));
}

// An empty config file is a mistake (it trained with the defaults); empty text through the API is still
// the no-config case, and /dev/zero is refused without reading it.
TEST(Config, AnEmptyConfigFileOrADeviceIsRefusedButEmptyTextIsTheDefaults) {
  const std::string path = ::testing::TempDir() + "/strata_empty_config.json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  auto cfg = LoadConfigFile(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("config file '" + path + "' is empty"));
  std::remove(path.c_str());
  auto zero = LoadConfigFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("config file '/dev/zero' is not a regular file"));
  EXPECT_TRUE(ParseConfigWithOverrides("", {}).ok());
}

TEST(Config, LoadConfigFileMissingIsNotFound) {
  const std::string path = ::testing::TempDir() + "/strata_no_such_config.json";
  auto cfg = LoadConfigFile(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(path));
}

// Note [The batch triangle]: DeepSpeed's rules, with the numbers and the world size in the refusal.
absl::StatusOr<EngineConfig> OnRanks(const std::string& text, int world) {
  ConfigFacts facts;
  facts.world_size = world;
  return ParseConfigWithOverrides(text, {}, facts);
}

TEST(Config, TrainBatchSizeDerivesTheAccumulationAsDeepSpeedDoes) {
  auto one = OnRanks(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})", 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->gradient_accumulation_steps, 4);  // DeepSpeed: 16 / 4 / 1
  EXPECT_EQ(one->train_batch_size, 16);
  EXPECT_FALSE(one->notes.empty());
  auto two = OnRanks(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})", 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->gradient_accumulation_steps, 2);
  auto micro = OnRanks(R"({"train_batch_size": 48, "gradient_accumulation_steps": 3})", 4);
  ASSERT_TRUE(micro.ok()) << micro.status();
  EXPECT_EQ(micro->train_micro_batch_size_per_gpu, 4);  // 48 / 4 / 3
  auto only = OnRanks(R"({"train_batch_size": 32})", 4);
  ASSERT_TRUE(only.ok()) << only.status();
  EXPECT_EQ(only->train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(only->gradient_accumulation_steps, 1);
  auto none = OnRanks(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 4);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->train_batch_size, 24);
  // Without the world size, train_batch_size is kept for Engine::Create.
  const EngineConfig later = ParseOk(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_EQ(later.train_batch_size, 16);
  EXPECT_EQ(later.gradient_accumulation_steps, 1);
  EngineConfig resolved = later;
  ASSERT_TRUE(ResolveBatchSizes(1, &resolved).ok());
  EXPECT_EQ(resolved.gradient_accumulation_steps, 4);
}

TEST(Config, AnInconsistentBatchTriangleNamesTheThreeNumbersAndTheRanks) {
  auto bad = OnRanks(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                         "gradient_accumulation_steps": 2})", 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(bad.status().message());
  for (const char* part : {"train_batch_size (64)", "train_micro_batch_size_per_gpu (4)",
                           "gradient_accumulation_steps (2)", "over 1 data-parallel ranks", "4 x 2 x 1 = 8"}) {
    EXPECT_THAT(m, HasSubstr(part));
  }
  // 10 on 1 rank with micro 4: DeepSpeed derives accumulation 2 and then refuses 8 != 10.
  auto floor = OnRanks(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", 1);
  ASSERT_FALSE(floor.ok());
  EXPECT_THAT(std::string(floor.status().message()), HasSubstr("rounding down"));
  auto tiny = OnRanks(R"({"train_batch_size": 2})", 4);
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(std::string(tiny.status().message()), HasSubstr("over 4 data-parallel ranks"));
}

// Note ["auto"]: Hugging Face's ZeRO-3 template resolves from the front end's facts.
TEST(Config, AutoValuesResolveAsHuggingFaceDoes) {
  const std::string hf = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": 10, "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})";
  ConfigFacts facts;
  facts.world_size = 2;
  facts.hidden_size = 768;
  facts.total_steps = 300;
  auto cfg = ParseConfigWithOverrides(hf, {"optimizer.params.lr=3e-4"}, facts);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->stage, 3);
  EXPECT_FALSE(cfg->fp16.enabled);
  EXPECT_DOUBLE_EQ(cfg->optimizer.lr, 3e-4);  // warmup_max_lr "auto" = the optimizer's lr
  EXPECT_EQ(cfg->scheduler.warmup_min_lr, 0);
  EXPECT_EQ(cfg->scheduler.total_steps, 300);
  EXPECT_EQ(cfg->train_batch_size, 2);
  EXPECT_EQ(cfg->gradient_clipping, 1.0);   // TrainingArguments.max_grad_norm's default, as Hugging Face fills it
  EXPECT_TRUE(cfg->scheduler.shared_peak);  // warmup_max_lr "auto" is a number: every param group's peak
  std::string notes = ResolvedAutoLine(*cfg) + "\n";
  for (const std::string& n : cfg->notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("train_batch_size = 2, train_micro_batch_size_per_gpu = 1"));
  EXPECT_THAT(notes, HasSubstr("optimizer.params.betas = [0.9, 0.999]"));
  EXPECT_THAT(notes, HasSubstr("scheduler.params.warmup_max_lr = 0.0003"));
  EXPECT_THAT(notes, HasSubstr("gradient_clipping = 1.0"));
  EXPECT_THAT(notes, HasSubstr("zero_optimization.reduce_bucket_size = 589824"));
  EXPECT_THAT(notes, HasSubstr("zero_optimization.stage3_prefetch_bucket_size = 530841"));
  EXPECT_THAT(notes, HasSubstr("zero_optimization.stage3_param_persistence_threshold = 7680"));
  EXPECT_THAT(notes, HasSubstr("no effect"));
  EXPECT_THAT(notes, HasSubstr("steps_per_print"));
  // Without the run's length, total_num_steps cannot be resolved; the error names the key and the fix.
  ExpectInvalid(hf, {"scheduler.params.total_num_steps", "\"auto\"", "number of optimizer steps"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}})",
                {"scheduler.params.warmup_num_steps", "\"auto\""});
  ExpectInvalid(R"({"strata": {"seed": "auto"}})", {"strata.seed", "\"auto\"", "set it to"});
  // A front end's flag (strata train --grad-clip) replaces the "auto" first.
  auto flagged = ParseConfigWithOverrides(R"({"gradient_clipping": "auto"})", {"gradient_clipping=0.5"}, facts);
  ASSERT_TRUE(flagged.ok()) << flagged.status();
  EXPECT_EQ(flagged->gradient_clipping, 0.5);
}

// Note [Param groups]: whose lr each param group's schedule rises to. WarmupLR's warmup_max_lr defaults to each
// group's own lr; given (a number), or WarmupDecayLR's default 0.001, it is every group's peak. The resolved
// configuration says which.
TEST(Config, WarmupMaxLrGivenIsEveryParamGroupsPeak) {
  const auto peak = [](const std::string& text) {
    auto cfg = ParseConfig(text);
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    if (!cfg.ok()) return std::string();
    for (const auto& [key, value] : JobWideFields(*cfg)) {
      if (key == "scheduler.peak") return absl::StrCat(cfg->scheduler.shared_peak ? "shared: " : "own: ", value);
    }
    return std::string("missing");
  };
  EXPECT_EQ(peak(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})"),
            "own: each param group's lr");
  EXPECT_EQ(peak(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01}}})"),
            "shared: warmup_max_lr, for every param group");
  EXPECT_EQ(peak(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}}})"),
            "shared: warmup_max_lr, for every param group");
  EXPECT_EQ(peak(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5000}}})"),
            "own: each param group's lr");
  EXPECT_EQ(peak("{}"), "own: each param group's lr");
}

// Note [One pass, every problem]: every problem at once, each with its key path and its fix.
TEST(Config, EveryProblemIsReportedInOnePass) {
  auto cfg = ParseConfig(R"({
    "zero_optimization": {"stage": 5, "stag": 1, "zero_hpz_partition_size": 8, "overlap_comm": true,
                          "zero_quantized_weights": true, "zero_quantized_gradients": false},
    "bfloat16": {"enabled": true},
    "activation_checkpointing": {"partition_activations": true},
    "optimizer": {"type": "AdamW", "params": {"lr": -1}},
    "gradient_clipping": "big"})");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(cfg.status().message());
  EXPECT_THAT(m, HasSubstr("the config has 8 problems"));
  for (const char* part : {"'zero_optimization.stage' is 5", "did you mean 'zero_optimization.stage'",
                           "'zero_optimization.zero_hpz_partition_size' is DeepSpeed's; Strata's equivalent is "
                           "'zero_optimization.shard_group_size'",
                           "'zero_optimization.zero_quantized_weights' is a DeepSpeed feature Strata does not have",
                           "'bfloat16' is DeepSpeed's; Strata's equivalent is 'bf16'",
                           "'activation_checkpointing' is DeepSpeed's", "--activation-checkpointing",
                           "'optimizer.params.lr' is -1", "'gradient_clipping' must be a number"}) {
    EXPECT_THAT(m, HasSubstr(part));
  }
  EXPECT_THAT(m, Not(HasSubstr("overlap_comm")));           // no effect: accepted
  EXPECT_THAT(m, Not(HasSubstr("zero_quantized_gradients")));  // false asks for nothing
}

TEST(Config, AdamFollowsAdamWModeAndAdamWIsAlwaysDecoupled) {
  EXPECT_TRUE(ParseOk(R"({"optimizer": {"type": "Adam"}})").optimizer.adam_w_mode);
  EXPECT_FALSE(ParseOk(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})").optimizer.adam_w_mode);
  EXPECT_TRUE(ParseOk(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})").optimizer.adam_w_mode);
  EXPECT_TRUE(ParseOk(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true}}})").optimizer.adam_w_mode);
  ExpectInvalid(R"({"optimizer": {"type": "SGD", "params": {"adam_w_mode": false}}})",
                {"optimizer.params.adam_w_mode", "Adam/AdamW only"});
}

TEST(Config, WeightDecayOfOneDimensionalParametersIsAStrataKey) {
  EXPECT_TRUE(ParseOk("{}").weight_decay_1d);
  EXPECT_FALSE(ParseOk(R"({"strata": {"weight_decay_1d": false}})").weight_decay_1d);
  ExpectInvalid(R"({"strata": {"weight_decay_1d": 1}})", {"strata.weight_decay_1d", "a boolean"});
}

TEST(Config, WarmupCosineLRTakesDeepSpeedsParameters) {
  const EngineConfig cfg = ParseOk(R"({"optimizer": {"params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": 100, "warmup_num_steps": 10, "warmup_min_ratio": 0.2, "warmup_type": "linear"}}})");
  EXPECT_EQ(cfg.scheduler.type, LrScheduleType::kWarmupCosineLR);
  EXPECT_DOUBLE_EQ(cfg.scheduler.warmup_min_ratio, 0.2);
  EXPECT_DOUBLE_EQ(cfg.scheduler.cos_min_ratio, 1e-4);
  EXPECT_FALSE(cfg.scheduler.log_warmup);
  ExpectInvalid(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
                    "warmup_max_lr": 1e-3}}})", {"scheduler.params.warmup_max_lr", "optimizer.params.lr"});
  ExpectInvalid(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_ratio": 0.1}}})",
                {"scheduler.params.warmup_min_ratio", "WarmupCosineLR only"});
  const EngineConfig warmup = ParseOk(R"({"optimizer": {"params": {"lr": 5e-4}}, "scheduler": {"type": "WarmupLR"}})");
  EXPECT_DOUBLE_EQ(warmup.optimizer.lr, 5e-4);  // WarmupLR's warmup_max_lr defaults to the optimizer's lr
}

TEST(Config, ValidKeyPathsCoverEveryLevel) {
  const std::vector<std::string>& paths = ValidKeyPaths();
  for (const char* key : {"train_micro_batch_size_per_gpu", "bf16.enabled", "fp16.loss_scale_window",
                          "optimizer.params.betas", "scheduler.params.cos_min_ratio",
                          "zero_optimization.stage", "zero_optimization.offload_param.nvme_path",
                          "zero_optimization.offload_optimizer.buffer_count", "strata.host_budget"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), key), paths.end()) << key;
  }
  EXPECT_EQ(std::find(paths.begin(), paths.end(), "zero_optimization.stag"), paths.end());
}

}  // namespace
}  // namespace strata::engine
