// `strata plan`: will a model fit a cluster under a Strata config, and how fast will a step be. The model
// is any that implements the model interface (spec/model_spec.h; the GPT by default).
//
// Memory is the engine's own accounting (Note [Memory accounting], runtime/engine/accounting.h) over the
// units the model registers (ModelSpec::Units), laid out for the shard group by shard::UnitLayout::Build and
// DecideExtents, plus the trainer's activations as the model sizes its workspace (ModelSpec::ActivationBytes):
// nothing is allocated and no formula is restated here. A shard group of G ranks lays out exactly as a
// world of G ranks does.
//
// Time is a model (docs/decisions/0017-strata-plan.md): compute at a stated fraction of the matmul
// rate from the model's FLOPs, each collective by alpha-beta over the link its group spans (inside a
// node or across), overlapped as the engine schedules the model's uses of its units (ModelSpec::Uses: the
// gather of use i+1 under the compute of use i; reductions under the backward of the use before), the
// update at the rate its tier streams, and the offload copies and NVMe traffic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/accounting.h"
#include "runtime/engine/config.h"
#include "spec/model_spec.h"
#include "tools/plan/plan_device.h"

namespace strata::tools::plan {

struct PlanInput {
  std::shared_ptr<const spec::ModelSpec> model;
  engine::EngineConfig engine;
  bool checkpointing = false;
  int ranks = 1;
  int ranks_per_node = 1;
  int shard_group = 0;  // G; 0 = every rank (ZeRO over the world)
  DeviceSpec device;
  double compute_efficiency = 0.5;  // achieved / matmul rate for the model's FLOPs
  double link_efficiency = 0.8;     // achieved / bus bandwidth of the presets (1 for measured figures)
};

// Alpha-beta cost of a ring collective over p ranks on one link (bus-bandwidth convention): an
// all-gather or reduce-scatter whose full buffer is `bytes` moves (p-1)/p of it in p-1 steps; an
// all-reduce of `bytes` twice that.
double AllGatherSeconds(uint64_t bytes, int p, const Link& link);
double ReduceScatterSeconds(uint64_t bytes, int p, const Link& link);
double AllReduceSeconds(uint64_t bytes, int p, const Link& link);

struct MemoryPlan {
  engine::MemoryNeed engine;     // what the engine tracks, per tier (its MemoryTracker's peak)
  uint64_t activations = 0;      // the trainer's workspace for one micro-batch
  uint64_t unit_copy = 0;        // the trainer's fp32 copy of the unit in use (low-precision params)
  uint64_t tier[3] = {0, 0, 0};  // per rank: device (engine + trainer on GPUs), pinned host, NVMe
  uint64_t host_resident = 0;    // on hosts: the trainer's bytes, in host memory beside the tiers
  bool fits = false;
  std::string why_not;           // the first tier that does not fit, or ""
};

struct TimePlan {
  double compute_s = 0;          // forward + backward (+ recompute) of every micro-batch
  double gather_s = 0;           // every all-gather of a step, in full
  double reduce_s = 0;           // every gradient reduction of a step, in full (in-group and across groups)
  double exposed_comm_s = 0;     // what the schedule leaves exposed
  double optimizer_s = 0;        // the update, the parameter replication after it
  double io_s = 0;               // offload copies and NVMe traffic, exposed
  double step_s = 0;
  double tokens_per_s = 0;       // the whole job's
  double mfu = 0;                // model FLOPs (3x forward, no recompute) / (step x matmul rate)
};

struct Plan {
  PlanInput in;
  int shard_group = 0;           // resolved G
  int64_t params = 0;
  MemoryPlan memory;
  TimePlan time;
  int max_micro_batch = 0;       // the largest that fits (0: not even 1)
};

absl::Status Validate(const PlanInput& in);
// Memory only (no validation: Evaluate validates).
absl::StatusOr<MemoryPlan> PlanMemory(const PlanInput& in);
absl::StatusOr<TimePlan> PlanTime(const PlanInput& in);
// Validates, then memory, time and the largest micro-batch that fits.
absl::StatusOr<Plan> Evaluate(const PlanInput& in);

// --search: every stage 0-3, every G that divides the ranks (stage 0 has none), at the largest micro-batch
// that fits (at most `in`'s micro-batch x accumulation sequences per rank per step, keeping the tokens per
// step), ranked by tokens/s. Infeasible candidates are left out; none feasible is an error saying so.
absl::StatusOr<std::vector<Plan>> Search(const PlanInput& in);

}  // namespace strata::tools::plan
