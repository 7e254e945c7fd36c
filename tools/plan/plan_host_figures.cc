#include "tools/plan/plan_host_figures.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/json_input.h"

namespace strata::tools::plan {

namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{16} << 20;  // the doctor writes a few KiB
constexpr double kMaxRate = 1e9;                          // GB/s or GFLOP/s: anything above is not a measurement
constexpr const char* kPrefix = "facts.host_figures.";

// A rate in [0, kMaxRate) (0 = not measured) at h[key], named by its path.
absl::StatusOr<double> Rate(const checkpoint::JsonReader& r, const nlohmann::json& h, const char* key) {
  STRATA_ASSIGN_OR_RETURN(const double v, r.Number(h, key, absl::StrCat(kPrefix, key)));
  if (!(v >= 0 && v < kMaxRate))
    return r.Bad(absl::StrCat(kPrefix, key), absl::StrCat("must be in [0, 1e9) (got ", v, ")"));
  return v;
}

}  // namespace

absl::StatusOr<HostFigures> ParseHostFigures(absl::string_view text, const std::string& where) {
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, checkpoint::ParseUntrustedJson(text, where));
  const checkpoint::JsonReader r(where);
  STRATA_RETURN_IF_ERROR(r.IsObject(j, "the document"));
  auto facts = j.find("facts");
  if (facts == j.end()) return r.Bad("facts", "is missing (is this `strata doctor --json` output?)");
  STRATA_RETURN_IF_ERROR(r.IsObject(*facts, "facts"));
  auto h = facts->find("host_figures");
  if (h == facts->end()) return r.Bad("facts.host_figures", "is missing (run `strata doctor --measure --json`)");
  STRATA_RETURN_IF_ERROR(r.IsObject(*h, "facts.host_figures"));
  HostFigures out;
  STRATA_ASSIGN_OR_RETURN(const int64_t cores, r.Int(*facts, "cpu_cores", "facts.cpu_cores", 0, 1 << 20));
  out.cpu_cores = static_cast<int>(cores);
  STRATA_ASSIGN_OR_RETURN(const int64_t ranks, r.Int(*h, "ranks", "facts.host_figures.ranks", 1, 1 << 20));
  out.ranks = static_cast<int>(ranks);
  STRATA_ASSIGN_OR_RETURN(out.matmul_gflops, Rate(r, *h, "matmul_gflops"));
  STRATA_ASSIGN_OR_RETURN(out.matmul_gflops_one_rank, Rate(r, *h, "matmul_gflops_one_rank"));
  STRATA_ASSIGN_OR_RETURN(out.update_gbps, Rate(r, *h, "update_gbps"));
  STRATA_ASSIGN_OR_RETURN(out.allgather_gbps, Rate(r, *h, "allgather_gbps"));
  STRATA_ASSIGN_OR_RETURN(out.reduce_scatter_gbps, Rate(r, *h, "reduce_scatter_gbps"));
  STRATA_ASSIGN_OR_RETURN(out.allreduce_gbps, Rate(r, *h, "allreduce_gbps"));
  STRATA_ASSIGN_OR_RETURN(out.alpha_us, Rate(r, *h, "alpha_us"));
  STRATA_ASSIGN_OR_RETURN(out.comm_error, r.Str(*h, "comm_error", "facts.host_figures.comm_error"));
  return out;
}

absl::StatusOr<HostFigures> ReadHostFigures(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const uint64_t size, checkpoint::FileSize(path));
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes is not a doctor report (at most 16MiB)"));
  }
  STRATA_ASSIGN_OR_RETURN(const std::string text, checkpoint::ReadFile(path));
  return ParseHostFigures(text, path);
}

absl::Status ApplyHostFigures(const HostFigures& h, const std::string& where, int ranks, int ranks_per_node,
                              const spec::Flags& flags, DeviceSpec* d) {
  // A measured figure, or an error saying what is missing and how to get it.
  auto need = [&](double v, const char* key, const char* flag, const std::string& why) -> absl::StatusOr<double> {
    if (v > 0) return v;
    return absl::InvalidArgumentError(absl::StrCat(where, ": facts.host_figures.", key, " ", why,
                                                   "; rerun `strata doctor --measure --ranks ", ranks_per_node,
                                                   " --json`, or give --", flag));
  };
  if (!flags.Has("cores-per-node")) d->cores_per_node = h.cpu_cores;
  if (!flags.Has("matmul-gflops")) {
    double v = 0;
    const char* key = "matmul_gflops";
    if (ranks_per_node == h.ranks) {
      v = h.matmul_gflops;
    } else if (ranks_per_node == 1) {
      v = h.matmul_gflops_one_rank;
      key = "matmul_gflops_one_rank";
    }
    const std::string why = v > 0 || ranks_per_node == h.ranks || ranks_per_node == 1
                                ? "is 0 (not measured)"
                                : absl::StrCat("was measured with ", h.ranks, " ranks per node, the plan has ",
                                               ranks_per_node);
    STRATA_ASSIGN_OR_RETURN(const double g, need(v, key, "matmul-gflops", why));
    d->matmul_flops = g * 1e9;
  }
  if (!flags.Has("update-gbps")) {
    STRATA_ASSIGN_OR_RETURN(const double u, need(h.update_gbps, "update_gbps", "update-gbps", "is 0 (not measured)"));
    d->host_memory_bytes_per_s = u * 1e9;
    if (!d->gpu) d->memory_bytes_per_s = d->host_memory_bytes_per_s;
  }
  if (ranks <= 1 || ranks_per_node <= 1) return absl::OkStatus();  // no intra-node collective
  const std::string not_measured = h.comm_error.empty() ? std::string("is 0 (not measured)")
                                                        : absl::StrCat("is 0 (not measured: ", h.comm_error, ")");
  const std::string why =
      ranks_per_node == h.ranks
          ? not_measured
          : absl::StrCat("was measured over ", h.ranks, " ranks, the plan has ", ranks_per_node, " per node");
  const bool same = ranks_per_node == h.ranks;
  const bool all = flags.Has("intra-gbps");
  struct Item {
    double value;
    const char* key;
    const char* flag;
    double* into;
  };
  const Item items[] = {
      {h.allgather_gbps, "allgather_gbps", "allgather-gbps", &d->intra.all_gather_bytes_per_s},
      {h.reduce_scatter_gbps, "reduce_scatter_gbps", "reduce-scatter-gbps", &d->intra.reduce_scatter_bytes_per_s},
      {h.allreduce_gbps, "allreduce_gbps", "allreduce-gbps", &d->intra.all_reduce_bytes_per_s},
  };
  for (const Item& it : items) {
    if (all || flags.Has(it.flag)) continue;
    STRATA_ASSIGN_OR_RETURN(const double g, need(same ? it.value : 0, it.key, it.flag, why));
    *it.into = g * 1e9;
  }
  // alpha may truly be ~0 (the two-size fit clamps at 0): present is enough, at the measured shape.
  if (!flags.Has("alpha-us") && same && h.comm_error.empty()) {
    d->intra.alpha_s = h.alpha_us * 1e-6;
    if (d->inter.alpha_s < d->intra.alpha_s) d->inter.alpha_s = d->intra.alpha_s;
  }
  return absl::OkStatus();
}

}  // namespace strata::tools::plan
