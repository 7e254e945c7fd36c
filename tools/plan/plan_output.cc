// `strata plan`'s output: JSON for tools, text for people. Both print the same numbers.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/base/units.h"
#include "tools/plan/plan_options.h"

namespace strata::tools::plan {

namespace {

const char* OffloadName(engine::OffloadDevice d) {
  switch (d) {
    case engine::OffloadDevice::kNone: return "none";
    case engine::OffloadDevice::kCpu: return "cpu";
    case engine::OffloadDevice::kNvme: return "nvme";
  }
  return "?";
}

// ", params on cpu" where the kind is offloaded, else "".
std::string Where(const char* what, engine::OffloadDevice d) {
  return d == engine::OffloadDevice::kNone ? "" : absl::StrCat(what, OffloadName(d));
}

const char* DTypeText(DType d) { return d == DType::kF32 ? "fp32" : d == DType::kBF16 ? "bf16" : "fp16"; }

nlohmann::json ToJson(const Plan& p) {
  const PlanInput& in = p.in;
  const engine::EngineConfig& c = in.engine;
  nlohmann::json items = nlohmann::json::array();
  for (const engine::NeedItem& i : p.memory.engine.items) {
    items.push_back({{"tier", std::string(memory::TierName(i.tier))}, {"what", i.what}, {"bytes", i.bytes}});
  }
  const TimePlan& t = p.time;
  nlohmann::json model = {{"params", p.params}};
  for (const spec::Dimension& d : in.model->Dimensions()) model[d.name] = d.value;
  return {
      {"model", model},
      {"cluster",
       {{"ranks", in.ranks},
        {"ranks_per_node", in.ranks_per_node},
        {"shard_group_size", p.shard_group},
        {"replicas", in.ranks / p.shard_group},
        {"device", in.device.name},
        {"cores_per_node", in.device.cores_per_node}}},
      {"config",
       {{"stage", c.stage},
        {"micro_batch", c.train_micro_batch_size_per_gpu},
        {"grad_accum", c.gradient_accumulation_steps},
        {"param_dtype", DTypeText(c.param_dtype)},
        {"offload_param", OffloadName(c.offload_param.device)},
        {"offload_optimizer", OffloadName(c.offload_optimizer.device)},
        {"activation_checkpointing", in.checkpointing}}},
      {"memory",
       {{"device_bytes", p.memory.tier[0]},
        {"pinned_host_bytes", p.memory.tier[1]},
        {"nvme_bytes", p.memory.tier[2]},
        {"nvme_disk_bytes", p.memory.tier[2] + p.memory.engine.nvme_room},
        {"engine",
         {{"device", p.memory.engine.tier[0]},
          {"pinned_host", p.memory.engine.tier[1]},
          {"nvme", p.memory.engine.tier[2]}}},
        {"activations_bytes", p.memory.activations},
        {"unit_copy_bytes", p.memory.unit_copy},
        {"host_resident_bytes", p.memory.host_resident},
        {"items", items},
        {"fits", p.memory.fits},
        {"why_not", p.memory.why_not}}},
      {"time",
       {{"step_ms", t.step_s * 1e3},
        {"compute_ms", t.compute_s * 1e3},
        {"gather_ms", t.gather_s * 1e3},
        {"reduce_ms", t.reduce_s * 1e3},
        {"exposed_comm_ms", t.exposed_comm_s * 1e3},
        {"optimizer_ms", t.optimizer_s * 1e3},
        {"io_ms", t.io_s * 1e3},
        {"tokens_per_s", t.tokens_per_s},
        {"mfu", t.mfu},
        {"compute_efficiency", in.compute_efficiency},
        {"link_efficiency", in.link_efficiency}}},
      {"max_micro_batch", p.max_micro_batch},
  };
}

}  // namespace

std::string PlanJson(const Plan& p) { return ToJson(p).dump() + "\n"; }

std::string SearchJson(const std::vector<Plan>& plans) {
  nlohmann::json all = nlohmann::json::array();
  for (const Plan& p : plans) all.push_back(ToJson(p));
  return nlohmann::json{{"candidates", all}}.dump() + "\n";
}

std::string PlanText(const Plan& p) {
  const PlanInput& in = p.in;
  const engine::EngineConfig& c = in.engine;
  const TimePlan& t = p.time;
  std::string s = absl::StrFormat(
      "%s (%.3g B params) on %d x %s (%d per node), stage %d, shard groups of %d (%d replicas), micro-batch %d x %d, "
      "%s%s%s%s\n",
      in.model->Describe(), p.params / 1e9, in.ranks, in.device.name, in.ranks_per_node, c.stage, p.shard_group,
      in.ranks / p.shard_group, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,
      DTypeText(c.param_dtype), in.checkpointing ? ", activation checkpointing" : "",
      Where(", params on ", c.offload_param.device), Where(", optimizer on ", c.offload_optimizer.device));
  absl::StrAppend(&s, "memory per rank: device ", FormatBytes(p.memory.tier[0]), ", pinned host ",
                  FormatBytes(p.memory.tier[1]), ", NVMe ", FormatBytes(p.memory.tier[2]), "\n");
  for (const engine::NeedItem& i : p.memory.engine.items) {
    absl::StrAppend(&s, "  ", memory::TierName(i.tier), ": ", i.what, " ", FormatBytes(i.bytes), "\n");
  }
  if (p.memory.engine.nvme_room > 0) {
    absl::StrAppend(&s, "  NVMe disk per rank: ", FormatBytes(p.memory.tier[2] + p.memory.engine.nvme_room),
                    " where it has the room (the optimizer state's files once more, ",
                    FormatBytes(p.memory.engine.nvme_room),
                    ", for the steps over an asynchronous checkpoint), else the NVMe need above; a checkpoint on the "
                    "same disk takes its own size besides\n");
  }
  const std::string copy = p.memory.unit_copy ? absl::StrCat(", fp32 unit copy ", FormatBytes(p.memory.unit_copy)) : "";
  absl::StrAppend(&s, "  ", in.device.gpu ? "device" : "host memory", ": trainer activations ",
                  FormatBytes(p.memory.activations), copy, "\n");
  absl::StrAppend(&s, p.memory.fits ? "fits" : absl::StrCat("does NOT fit: ", p.memory.why_not),
                  "; the largest micro-batch that fits: ", p.max_micro_batch, "\n");
  absl::StrAppend(&s, absl::StrFormat(
      "step %.1f ms: compute %.1f (at %.0f%% of %.4g TFLOP/s), exposed communication %.1f (gathers %.1f, "
      "reductions %.1f in all), update %.1f, exposed I/O %.1f; %.0f tokens/s, MFU %.1f%%\n",
      t.step_s * 1e3, t.compute_s * 1e3, 100 * in.compute_efficiency, in.device.matmul_flops / 1e12,
      t.exposed_comm_s * 1e3, t.gather_s * 1e3, t.reduce_s * 1e3, t.optimizer_s * 1e3, t.io_s * 1e3, t.tokens_per_s,
      100 * t.mfu));
  return s;
}

std::string SearchText(const std::vector<Plan>& plans) {
  std::string s = "stage  G     replicas  micro-batch  accum  device/rank  step ms   tokens/s     MFU\n";
  for (const Plan& p : plans) {
    absl::StrAppend(&s, absl::StrFormat("%-6d %-5d %-9d %-12d %-6d %-12s %-9.1f %-12.0f %.1f%%\n", p.in.engine.stage,
                                        p.shard_group, p.in.ranks / p.shard_group,
                                        p.in.engine.train_micro_batch_size_per_gpu,
                                        p.in.engine.gradient_accumulation_steps, FormatBytes(p.memory.tier[0]),
                                        p.time.step_s * 1e3, p.time.tokens_per_s, 100 * p.time.mfu));
  }
  if (!plans.empty()) absl::StrAppend(&s, "recommended:\n", PlanText(plans.front()));
  return s;
}

}  // namespace strata::tools::plan
