// `strata plan`: validation, one evaluation, the largest micro-batch that fits, and --search.
#include "tools/plan/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "tools/plan/plan_units.h"

namespace strata::tools::plan {

namespace {
constexpr int kMaxMicroBatch = 1 << 16;  // a search bound, far past any device's memory
}  // namespace

absl::Status Validate(const PlanInput& in) {
  if (in.model == nullptr) return absl::InvalidArgumentError("no model to plan");
  STRATA_RETURN_IF_ERROR(in.model->Validate());
  if (in.ranks < 1 || in.ranks > shard::kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks ", in.ranks, " is out of range [1, ", shard::kMaxWorldSize, "]"));
  }
  if (in.ranks_per_node < 1 || in.ranks_per_node > in.ranks || in.ranks % in.ranks_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks-per-node ", in.ranks_per_node,
                                                   " must be at least 1 and divide --ranks ", in.ranks));
  }
  const int G = ShardGroup(in);
  if (G < 1 || G > in.ranks || in.ranks % G != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-group-size ", in.shard_group, " must divide --ranks ", in.ranks));
  }
  if (G != in.ranks && in.engine.stage == 0) {
    return absl::InvalidArgumentError("--shard-group-size with stage 0: plain data parallelism shards nothing");
  }
  if (in.engine.offload_param.device != engine::OffloadDevice::kNone && in.engine.stage != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("offload_param needs ZeRO stage 3 (stage is ", in.engine.stage, "), as the engine requires"));
  }
  if (in.device.gpu && in.engine.offload_optimizer.device != engine::OffloadDevice::kNone && in.engine.stage < 2) {
    return absl::InvalidArgumentError(absl::StrCat("offload_optimizer on a GPU needs ZeRO stage 2 or 3 (stage is ",
                                                   in.engine.stage, "), as the engine on CUDA requires"));
  }
  if (!(in.compute_efficiency > 0 && in.compute_efficiency <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute-efficiency ", in.compute_efficiency, " is not in (0, 1]"));
  }
  if (!(in.link_efficiency > 0 && in.link_efficiency <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--link-efficiency ", in.link_efficiency, " is not in (0, 1]"));
  }
  const DeviceSpec& d = in.device;
  if (!(d.matmul_flops > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("device '", d.name, "' has no matmul rate: give --host-figures "
                                                   "(`strata doctor --measure --json` writes it) or --matmul-gflops"));
  }
  const bool multi = in.ranks > 1;
  if (multi && !(d.intra.all_gather_bytes_per_s > 0 && d.intra.reduce_scatter_bytes_per_s > 0 &&
                 d.intra.all_reduce_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device '", d.name, "' has no link bandwidths for ", in.ranks, " ranks: give --allgather-gbps, "
        "--reduce-scatter-gbps and --allreduce-gbps, or --host-figures (`strata doctor --measure` measures them)"));
  }
  if (in.ranks > in.ranks_per_node && !(d.inter.all_gather_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", d.name, "' has no inter-node bandwidth: give --inter-gbps"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> Evaluate(const PlanInput& in) {
  STRATA_RETURN_IF_ERROR(Validate(in));
  Plan p;
  p.in = in;
  p.shard_group = ShardGroup(in);
  p.params = in.model->NumParams();
  STRATA_ASSIGN_OR_RETURN(p.memory, PlanMemory(in));
  STRATA_ASSIGN_OR_RETURN(p.time, PlanTime(in));
  // Only the trainer's workspace grows with the micro-batch, so the engine is laid out once and the
  // largest micro-batch that fits is a binary search over the workspace.
  STRATA_ASSIGN_OR_RETURN(const EngineLayout e, LayOutEngine(in));
  auto fits = [&](int b) { return MemoryAt(in, e, b).fits; };
  int lo = 0, hi = kMaxMicroBatch;  // fits(lo) or lo == 0; hi does not fit or is the bound
  if (fits(hi)) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
  }
  p.max_micro_batch = lo;
  return p;
}

absl::StatusOr<std::vector<Plan>> Search(const PlanInput& in) {
  STRATA_RETURN_IF_ERROR(Validate(in));
  const int per_rank = in.engine.train_micro_batch_size_per_gpu * in.engine.gradient_accumulation_steps;
  std::vector<Plan> out;
  std::string last_reason;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int G = 1; G <= in.ranks; ++G) {
      if (in.ranks % G != 0 || (stage == 0 && G != in.ranks)) continue;
      PlanInput c = in;
      c.engine.stage = stage;
      c.shard_group = G;
      if (stage != 3) c.engine.offload_param.device = engine::OffloadDevice::kNone;
      // The largest micro-batch that fits and divides the sequences per rank per step.
      c.engine.train_micro_batch_size_per_gpu = 1;
      c.engine.gradient_accumulation_steps = per_rank;
      STRATA_ASSIGN_OR_RETURN(Plan probe, Evaluate(c));
      if (probe.max_micro_batch < 1) {
        last_reason = probe.memory.why_not;
        continue;
      }
      int b = std::min(per_rank, probe.max_micro_batch);
      while (per_rank % b != 0) --b;
      c.engine.train_micro_batch_size_per_gpu = b;
      c.engine.gradient_accumulation_steps = per_rank / b;
      STRATA_ASSIGN_OR_RETURN(Plan p, Evaluate(c));
      out.push_back(std::move(p));
    }
  }
  if (out.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no stage, shard group size and micro-batch fits: ", last_reason,
                     "; offload (--offload-optimizer, --offload-params), more ranks or a larger device"));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Plan& a, const Plan& b) { return a.time.tokens_per_s > b.time.tokens_per_s; });
  return out;
}

}  // namespace strata::tools::plan
