#include "tools/plan/plan_options.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "spec/registry.h"
#include "tools/plan/plan_host_figures.h"

namespace strata::tools::plan {

namespace {

constexpr double kGB = 1e9;

// Splits `args` into the plan's own flags and the rest (strata train's), keeping "--name value" pairs
// together. Both lists were checked by one parse over both flag sets before.
void Split(const std::vector<std::string>& args, const std::vector<spec::FlagDef>& own, std::vector<std::string>* mine,
           std::vector<std::string>* rest) {
  std::set<std::string> names, booleans;
  for (const spec::FlagDef& d : own) {
    names.insert(d.name);
    if (d.boolean) booleans.insert(d.name);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string name = absl::StartsWith(a, "--") ? a.substr(2) : "";
    const bool inline_value = name.find('=') != std::string::npos;
    if (inline_value) name = name.substr(0, name.find('='));
    std::vector<std::string>* to = names.count(name) ? mine : rest;
    to->push_back(a);
    if (!name.empty() && !inline_value && !booleans.count(name) && names.count(name) && i + 1 < args.size()) {
      to->push_back(args[++i]);
    }
  }
}

// A flag in `unit`s (GB/s, GFLOP/s, GB), > 0, times `unit`; or the fallback (already in base units) when absent.
absl::StatusOr<double> Rate(const spec::Flags& f, const char* name, double fallback, double unit) {
  if (!f.Has(name)) return fallback;
  STRATA_ASSIGN_OR_RETURN(const double v, f.Double(name, 0));
  if (!(v > 0 && v < 1e9))
    return absl::InvalidArgumentError(absl::StrCat("--", name, " ", f.Str(name), " must be > 0"));
  return v * unit;
}

absl::Status ApplyDeviceFlags(const spec::Flags& f, DeviceSpec* d) {
  STRATA_ASSIGN_OR_RETURN(d->matmul_flops, Rate(f, "matmul-gflops", d->matmul_flops, 1e9));
  Link& in = d->intra;
  // --intra-gbps sets every collective's bandwidth; the per-collective flags override it.
  const bool all = f.Has("intra-gbps");
  STRATA_ASSIGN_OR_RETURN(const double link, Rate(f, "intra-gbps", in.all_gather_bytes_per_s, kGB));
  STRATA_ASSIGN_OR_RETURN(in.all_gather_bytes_per_s, Rate(f, "allgather-gbps", link, kGB));
  STRATA_ASSIGN_OR_RETURN(in.reduce_scatter_bytes_per_s,
                          Rate(f, "reduce-scatter-gbps", all ? link : in.reduce_scatter_bytes_per_s, kGB));
  STRATA_ASSIGN_OR_RETURN(in.all_reduce_bytes_per_s,
                          Rate(f, "allreduce-gbps", all ? link : in.all_reduce_bytes_per_s, kGB));
  STRATA_ASSIGN_OR_RETURN(const double inter, Rate(f, "inter-gbps", d->inter.all_gather_bytes_per_s, kGB));
  d->inter.all_gather_bytes_per_s = d->inter.reduce_scatter_bytes_per_s = d->inter.all_reduce_bytes_per_s = inter;
  if (f.Has("alpha-us")) {
    STRATA_ASSIGN_OR_RETURN(const double us, f.Double("alpha-us", 0));
    if (!(us >= 0 && us < 1e6)) return absl::InvalidArgumentError("--alpha-us must be in [0, 1e6)");
    in.alpha_s = us * 1e-6;
    if (d->inter.alpha_s < in.alpha_s) d->inter.alpha_s = in.alpha_s;
  }
  STRATA_ASSIGN_OR_RETURN(d->host_memory_bytes_per_s, Rate(f, "update-gbps", d->host_memory_bytes_per_s, kGB));
  if (!d->gpu) d->memory_bytes_per_s = d->host_memory_bytes_per_s;
  STRATA_ASSIGN_OR_RETURN(d->nvme_bytes_per_s, Rate(f, "nvme-gbps", d->nvme_bytes_per_s, kGB));
  STRATA_ASSIGN_OR_RETURN(const int64_t cores, f.IntIn("cores-per-node", d->cores_per_node, 0, 1 << 20));
  d->cores_per_node = static_cast<int>(cores);
  STRATA_ASSIGN_OR_RETURN(const double mem_gb, Rate(f, "device-memory-gb", double(d->memory_bytes), kGB));
  d->memory_bytes = static_cast<uint64_t>(mem_gb);
  STRATA_ASSIGN_OR_RETURN(const double host_gb, Rate(f, "host-memory-gb", double(d->host_bytes_per_node), kGB));
  d->host_bytes_per_node = static_cast<uint64_t>(host_gb);
  return absl::OkStatus();
}

}  // namespace

std::vector<spec::FlagDef> PlanFlagDefs() {
  return {
      {"ranks", false, "ranks of the job (default 1)"},
      {"ranks-per-node", false, "ranks that share a node (default: min(ranks, 8))"},
      {"device-preset", false, "h100-sxm | h200-sxm | host (default h200-sxm; host needs the measured rates)"},
      {"device-name", false, "what to call the device in the output (a preset changed by flags is another device)"},
      {"compute-efficiency", false, "achieved fraction of the matmul rate (default 0.5 on GPUs, 1 on host)"},
      {"link-efficiency", false, "achieved fraction of the presets' link bandwidths (default 0.8; 1 on host)"},
      {"host-figures", false, "host: the rates `strata doctor --measure --json` wrote to this file (flags override)"},
      {"matmul-gflops", false, "matmul rate per rank, GFLOP/s (host: `strata bench step`'s sgemm)"},
      {"intra-gbps", false, "bus bandwidth inside a node, GB/s, every collective"},
      {"allgather-gbps", false, "all-gather bus bandwidth inside a node, GB/s (`strata bench comm`)"},
      {"reduce-scatter-gbps", false, "reduce-scatter bus bandwidth inside a node, GB/s"},
      {"allreduce-gbps", false, "all-reduce bus bandwidth inside a node, GB/s"},
      {"inter-gbps", false, "bus bandwidth across nodes per rank, GB/s"},
      {"alpha-us", false, "latency per ring step inside a node, microseconds"},
      {"update-gbps", false, "memory bandwidth of the host optimizer update, GB/s"},
      {"nvme-gbps", false, "NVMe bandwidth per rank, GB/s"},
      {"cores-per-node", false,
       "host: cores a node's ranks share (default: the doctor's cpu_cores with --host-figures, "
       "else 0 = enough for compute and communication to overlap)"},
      {"device-memory-gb", false, "device memory per rank, GB (overrides the preset)"},
      {"host-memory-gb", false, "host memory per node, GB (overrides the preset)"},
      {"search", true, "recommend stage, shard group size and micro-batch (keeps micro-batch x accumulation)"},
      {"json", true, "one JSON object"},
  };
}

absl::StatusOr<PlanRequest> ParsePlanArgs(std::vector<std::string> args) {
  STRATA_ASSIGN_OR_RETURN(const spec::Family* family, spec::TakeFamily(&args));  // --model-family
  const std::vector<spec::FlagDef> own = PlanFlagDefs();
  std::vector<spec::FlagDef> all = own;
  const std::vector<spec::FlagDef> train = family->TrainFlagDefs();
  all.insert(all.end(), train.begin(), train.end());
  STRATA_ASSIGN_OR_RETURN(spec::Flags every, spec::Flags::Parse(args, all));  // unknown flags: the nearest of both sets
  if (!every.positional().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", every.positional()[0], "'"));
  }
  std::vector<std::string> mine, rest;
  Split(args, own, &mine, &rest);
  STRATA_ASSIGN_OR_RETURN(spec::Flags f, spec::Flags::Parse(mine, own));
  PlanRequest r;
  PlanInput& in = r.in;
  STRATA_ASSIGN_OR_RETURN(const int64_t ranks, f.IntIn("ranks", 1, 1, shard::kMaxWorldSize));
  in.ranks = static_cast<int>(ranks);
  STRATA_ASSIGN_OR_RETURN(const int64_t rpn, f.IntIn("ranks-per-node", std::min<int64_t>(ranks, 8), 1, ranks));
  in.ranks_per_node = static_cast<int>(rpn);
  STRATA_ASSIGN_OR_RETURN(in.device, DevicePreset(f.Str("device-preset", "h200-sxm")));
  if (f.Has("host-figures")) {
    if (in.device.gpu) {
      return absl::InvalidArgumentError(absl::StrCat("--host-figures is for --device-preset host (the device is '",
                                                     in.device.name, "')"));
    }
    const std::string path = f.Str("host-figures");
    STRATA_ASSIGN_OR_RETURN(const HostFigures h, ReadHostFigures(path));
    STRATA_RETURN_IF_ERROR(ApplyHostFigures(h, path, in.ranks, in.ranks_per_node, f, &in.device));
  }
  STRATA_RETURN_IF_ERROR(ApplyDeviceFlags(f, &in.device));
  in.device.name = f.Str("device-name", in.device.name);
  const bool host = !in.device.gpu;
  STRATA_ASSIGN_OR_RETURN(in.compute_efficiency, f.Double("compute-efficiency", host ? 1.0 : 0.5));
  STRATA_ASSIGN_OR_RETURN(in.link_efficiency, f.Double("link-efficiency", host ? 1.0 : 0.8));
  auto setup = family->ParseTrain(rest, in.ranks);
  if (!setup.ok()) return Annotate(setup.status(), "strata train's flags");
  in.model = (*setup)->model;
  in.engine = (*setup)->engine;
  in.checkpointing = (*setup)->checkpointing;
  // G is the engine's own key (zero_optimization.shard_group_size, or strata train's --shard-group-size):
  // "node" is the ranks that share a node; 0 the world.
  const int g = in.engine.shard_group_size;
  in.shard_group = g == engine::kShardGroupNode ? in.ranks_per_node : g;
  r.search = f.Bool("search");
  r.json = f.Bool("json");
  return r;
}

}  // namespace strata::tools::plan
