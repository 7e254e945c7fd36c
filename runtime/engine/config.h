// Engine configuration: one JSON file whose DeepSpeed keys mean what they mean in DeepSpeed, plus a
// "strata" object for Strata's own keys (docs/design.md "Configuration"). Command-line flags override it.
//
// Validation is total: an unknown key is an error naming the nearest valid key at that level; an
// out-of-range or wrongly typed value is an error naming the key path (e.g. "zero_optimization.stage").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/base/dtype.h"
#include "runtime/optim/hyper.h"

namespace strata::engine {

using OptimizerType = optim::OptimizerType;
using LrScheduleType = optim::LrScheduleType;
using OptimizerConfig = optim::OptimizerConfig;
using SchedulerConfig = optim::SchedulerConfig;
enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = true;
  int buffer_count = 4;
};

struct Fp16Config {
  bool enabled = false;
  double initial_scale_power = 16;  // initial loss scale = 2^power
  int loss_scale_window = 1000;     // grow after this many clean steps
  double min_loss_scale = 1;
  double static_loss_scale = 0;     // DeepSpeed "loss_scale": 0 = dynamic
  int hysteresis = 2;               // overflows in a row before the scale halves (Note [Dynamic loss scale])
  bool consecutive_hysteresis = false;  // a clean step refills the hysteresis (else only a growth does)
};

inline constexpr int kShardGroupWorld = 0;
inline constexpr int kShardGroupNode = -1;

// Note [Two sets of defaults]. The member initialisers below are the C++ API's defaults (what a trainer
// building an EngineConfig by hand gets: stage 3, weight decay as its ParamSpecs say). A JSON config means
// what DeepSpeed means, so ParseConfig starts from JsonDefaults() instead, which differs in DeepSpeed's
// stage 0 and in decaying 1-D parameters too (weight_decay_1d). docs/decisions/0028.
struct EngineConfig {
  // DeepSpeed keys.
  int stage = 3;                                // zero_optimization.stage, 0..3
  int train_micro_batch_size_per_gpu = 1;      // >= 1; an int: every consumer indexes with it
  int gradient_accumulation_steps = 1;
  // Note [The batch triangle]: train_batch_size = micro-batch x accumulation x data-parallel ranks. 0 = not
  // given; ResolveBatchSizes derives what the config left out (DeepSpeed's rules) and checks the three.
  int64_t train_batch_size = 0;
  bool micro_batch_given = true;    // false: train_micro_batch_size_per_gpu may be derived
  bool accumulation_given = true;   // false: gradient_accumulation_steps may be derived
  double gradient_clipping = 0.0;               // 0 = off
  bool bf16 = false;                            // bf16.enabled: param_dtype bf16
  Fp16Config fp16;                              // fp16.enabled: param_dtype fp16 + loss scaling
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  OffloadConfig offload_param;                  // zero_optimization.offload_param
  OffloadConfig offload_optimizer;              // zero_optimization.offload_optimizer
  // zero_optimization.shard_group_size (docs/design.md "Hybrid sharding"): the ranks a shard group holds, an
  // integer >= 1 dividing the world, or "node" (kShardGroupNode: the ranks sharing this host);
  // kShardGroupWorld (0, the default) is the whole world, ZeRO as it always was. Stages 1-3.
  int shard_group_size = 0;

  // strata keys ("strata": {...}).
  DType param_dtype = DType::kF32;              // strata.param_dtype; bf16/fp16 blocks set it too
  DType reduce_dtype = DType::kF32;             // strata.reduce_dtype
  int max_live_units = 2;                       // strata.max_live_units >= 1
  int prefetch_depth = 1;                       // strata.prefetch_depth >= 0
  bool reshard_after_forward = true;            // strata.reshard_after_forward
  int64_t collective_timeout_ms = 60000;        // strata.collective_timeout_ms > 0
  uint64_t seed = 1;                            // strata.seed
  uint64_t device_budget_bytes = ~uint64_t{0};  // strata.device_budget ("512MiB" or a number)
  uint64_t host_budget_bytes = ~uint64_t{0};    // strata.host_budget
  int optimizer_threads = 0;                    // strata.optimizer_threads in [0, 256]; 0 = the default
  // strata.optimizer_in_backward (torchtune's optimizer_in_bwd, torch's _apply_optimizer_in_backward):
  // each unit's update runs in backward as soon as its gradient is reduced, so no gradient shard is
  // kept. Stages 2-3 only, without accumulation, clipping or fp16 (CheckOptimizerInBackward;
  // docs/decisions/0018-step-in-backward.md).
  bool optimizer_in_backward = false;
  // strata.release_idle_memory: after each step the gradient memory (shards, working buffers, scratch)
  // gives its pages back to the OS until the next backward (plain host memory only; Note [Idle pages],
  // runtime/memory/memory.cc; docs/decisions/0021-idle-pages.md). The bytes stay reserved and counted.
  bool release_idle_memory = false;
  // strata.params_without_grad (Note [Parameters without a gradient], engine_step.cc): "zero" (false, the
  // default, DeepSpeed's: a parameter no rank wrote a gradient to in a step is updated with a zero
  // gradient, so it is decayed and its moments move) or "skip" (true, torch.optim's for a .grad of None:
  // not updated at all, its moments untouched and its own step count not advanced). strata.torch asks for
  // "skip" unless its config says otherwise. Trainers report such parameters with MarkNoGrad.
  bool skip_params_without_grad = false;
  // strata.weight_decay_1d: whether parameters of fewer than 2 dimensions (biases, norm gains) decay.
  // DeepSpeed decays every parameter of the optimizer's group (true, the JSON default); false is the GPT
  // convention `strata train` (without --config) and many recipes use. Applied by the trainers (the GPT,
  // strata.torch) when they choose each ParamSpec's weight_decay; the engine itself honours ParamSpecs.
  bool weight_decay_1d = false;
  // Lines for the log (rank 0, once, at Engine::Create): "auto" values resolved, the batch sizes derived,
  // DeepSpeed keys accepted without effect. Not part of the job's identity.
  std::vector<std::string> notes;
  // The keys whose "auto" was resolved (Note ["auto"]), "path" or "path = value"; logged by ResolvedAutoLine.
  std::vector<std::string> auto_resolved;
  // Elements per tile of NVMe-resident optimizer state (not a JSON key: the pinned staging buffers are
  // 3 x lanes tiles, so this is a memory knob the engine sizes; tests shrink it to exercise tiling).
  uint64_t nvme_tile_elems = uint64_t{1} << 20;
};

// The combinations strata.optimizer_in_backward supports (the parser and Engine::Create both check):
// InvalidArgument naming the key and the conflicting one otherwise.
absl::Status CheckOptimizerInBackward(const EngineConfig& cfg);

// The defaults of a JSON config: DeepSpeed's (Note [Two sets of defaults]).
EngineConfig JsonDefaults();

// What a front end knows that a config's "auto" values and its batch triangle are resolved from (Note
// ["auto"], config_deepspeed.h). Zero = not known.
struct ConfigFacts {
  int world_size = 0;        // data-parallel ranks; unknown: Engine::Create resolves the batch sizes
  int64_t hidden_size = 0;   // the model's hidden size (the ZeRO bucket sizes' "auto")
  int64_t total_steps = 0;   // optimizer steps the run takes (scheduler.params.total_num_steps "auto")
};

// Parses and validates a JSON document (the whole text). Missing keys keep JsonDefaults(). Every problem
// of the document is reported at once, in one InvalidArgument (Note [One pass, every problem]).
absl::StatusOr<EngineConfig> ParseConfig(std::string_view json_text);

// Reads a file and parses it; errors name the file.
absl::StatusOr<EngineConfig> LoadConfigFile(const std::string& path);

// Applies "key.path=value" overrides (flags) on top of a JSON document before validation, e.g.
// {"zero_optimization.stage=2", "strata.max_live_units=3", "optimizer.params.lr=3e-4"}. The value is
// parsed as JSON when it parses (numbers, true/false, arrays), else taken as a string.
absl::StatusOr<EngineConfig> ParseConfigWithOverrides(std::string_view json_text,
                                                      const std::vector<std::string>& overrides,
                                                      const ConfigFacts& facts = {});

// The log line of the "auto" values as resolved ("config: \"auto\" resolved: train_batch_size = 8, ..."),
// after ResolveBatchSizes; "" when the config had none.
std::string ResolvedAutoLine(const EngineConfig& cfg);

// Note [The batch triangle]: DeepSpeed's _set_batch_related_parameters and _batch_assertion over
// `world_size` data-parallel ranks. With train_batch_size given, the one of micro-batch and accumulation
// that the config left out is derived (floor divisions, as DeepSpeed; accumulation 1 when both are left
// out); without it, it is micro x accumulation x ranks. An inconsistent set is InvalidArgument naming the
// three numbers and the world size. Idempotent: Engine::Create calls it again with its world.
absl::Status ResolveBatchSizes(int world_size, EngineConfig* cfg);

// Note [One configuration]. The settings every rank of a job must share, as (key path, exact value) in a
// fixed order: whatever decides the collectives, the numbers or the initial values (stage, batch sizes,
// accumulation, clipping, precision, optimizer, schedule, offload devices, shard groups, seed, live units,
// prefetch, resharding, the update in backward). Engine::Create compares them across the ranks first. The
// rest may differ per rank and is left out: memory budgets, optimizer threads, the collective timeout,
// release_idle_memory, NVMe paths, pinning and tile sizes (each gives the same bits, or only this rank's
// memory or speed differs).
std::vector<std::pair<std::string, std::string>> JobWideFields(const EngineConfig& cfg);

// Every valid key path, for error messages and docs.
const std::vector<std::string>& ValidKeyPaths();

// Sizes the engine derives from the config and the model's shape alone; `strata doctor` estimates pinned
// memory with the same functions.
// Gathered units that can be live at once (stage 3 without resharding after forward keeps every unit).
int LiveGatheredUnits(const EngineConfig& cfg, int units);
// Elements per NVMe optimizer tile: strata.nvme_tile_elems (at least 1024), no more than the largest
// update range rounded up to 1024.
size_t NvmeTileElems(const EngineConfig& cfg, size_t largest_update);
// State arrays per element that the optimizer streams through NVMe: the fp32 master, then its state.
int NvmeLanes(const EngineConfig& cfg);
// Pinned staging tiles of the NVMe optimizer update: enough for read, update and write of every lane.
size_t NvmeStagingTiles(const EngineConfig& cfg);
// Threads of the host optimizer update: strata.optimizer_threads, or when 0 the CPUs this process may
// run on (its affinity mask), at most kMaxDefaultOptimizerThreads (past that the update is bound by
// memory bandwidth, and a pool that wide mostly costs wake-ups).
constexpr int kMaxDefaultOptimizerThreads = 64;
int OptimizerThreads(const EngineConfig& cfg);
// Pinned buffers of the NVMe parameter cache: one more than the live gathered units, at least.
size_t NvmeParamBuffers(const EngineConfig& cfg, int live);

}  // namespace strata::engine
