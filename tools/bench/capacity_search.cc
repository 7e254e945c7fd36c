// The candidate choice of `strata bench capacity`: see capacity_search.h, Note [Capacity search].
#include "tools/bench/capacity_search.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "tools/plan/plan_units.h"

namespace strata::tools {

std::shared_ptr<const spec::ModelSpec> Scaled(const std::shared_ptr<const spec::ModelSpec>& m, bool width, int64_t k) {
  return m->Scaled(width, k);
}

CandidateState FirstCandidate(int64_t base, bool use_prediction, int64_t predicted) {
  CandidateState s;
  if (use_prediction) {  // nothing above the prediction is tried: the size after it is the first failure
    s.k = std::max<int64_t>(predicted, 1);
    s.bad = s.k + 1;
  } else {
    s.k = std::max<int64_t>(base, 1);
  }
  return s;
}

bool NextCandidate(CandidateState& s, bool fitted) {
  (fitted ? s.good : s.bad) = s.k;
  s.k = s.bad == 0 ? 2 * s.k : (s.good + s.bad) / 2;  // doubling, then bisection
  return s.bad == 0 || s.bad - s.good > 1;
}

absl::StatusOr<int64_t> LargestFitting(int64_t limit, const std::function<absl::StatusOr<bool>(int64_t)>& fits) {
  int64_t good = 0, bad = 0, k = 1;
  while (k <= limit) {
    STRATA_ASSIGN_OR_RETURN(const bool ok, fits(k));
    if (!ok) {
      bad = k;
      break;
    }
    good = k;
    if (k == limit) return k;
    k = std::min(2 * k, limit);
  }
  if (bad == 0) return good;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    STRATA_ASSIGN_OR_RETURN(const bool ok, fits(mid));
    (ok ? good : bad) = mid;
  }
  return good;
}

absl::StatusOr<std::string> PredictedShortfall(const PredictInput& in, int64_t k) {
  plan::PlanInput p;
  p.model = Scaled(in.base, in.width, k);
  const int64_t params = p.model->NumParams();
  if (in.max_params > 0 && params > in.max_params) {
    return absl::StrCat(params, " parameters, over --max-params ", in.max_params);
  }
  p.engine = in.engine;
  p.ranks = p.ranks_per_node = in.ranks;
  p.shard_group = in.engine.shard_group_size;
  p.device.gpu = false;  // the search runs the host back-end
  STRATA_ASSIGN_OR_RETURN(const plan::EngineLayout e, plan::LayOutEngine(p));
  const uint64_t disk = in.free_disk > in.disk_reserve ? in.free_disk - in.disk_reserve : 0;
  const uint64_t nvme = e.need.tier[static_cast<int>(memory::Tier::kNvme)] * static_cast<uint64_t>(in.ranks);
  const struct {
    const char* tier;
    uint64_t need, room;
    std::string what;
  } checks[] = {
      {"device", e.need.tier[0], in.engine.device_budget_bytes, "--device-budget"},
      {"pinned_host", e.need.tier[1], in.engine.host_budget_bytes, "--host-budget"},
      {"nvme", nvme, disk,
       absl::StrCat("the free disk ", FormatBytes(in.free_disk), " less --disk-reserve ",
                    FormatBytes(in.disk_reserve))},
  };
  for (const auto& c : checks) {
    if (c.need > c.room) {
      return absl::StrCat("tier '", c.tier, "' needs ", FormatBytes(c.need), ", over ", c.what, " (",
                          FormatBytes(c.room), ")");
    }
  }
  return std::string();
}

absl::StatusOr<int64_t> PredictLargest(const PredictInput& in, int64_t limit) {
  return LargestFitting(limit, [&](int64_t k) -> absl::StatusOr<bool> {
    STRATA_ASSIGN_OR_RETURN(const std::string why, PredictedShortfall(in, k));
    return why.empty();
  });
}

}  // namespace strata::tools
