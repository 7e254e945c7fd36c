// `strata plan`'s command line: its own flags (the cluster and the device), beside `strata train`'s (the
// model, the config and its overrides), which mean what they mean to `strata train`; and the output.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/cli/flags.h"
#include "tools/plan/plan.h"

namespace strata::tools::plan {

struct PlanRequest {
  PlanInput in;
  bool search = false;
  bool json = false;
};

std::vector<FlagDef> PlanFlagDefs();  // the plan's own (not strata train's)
absl::StatusOr<PlanRequest> ParsePlanArgs(const std::vector<std::string>& args);

// One JSON object per plan (schema in docs/decisions/0017-strata-plan.md); --search: {"candidates": [...]}.
std::string PlanJson(const Plan& p);
std::string SearchJson(const std::vector<Plan>& plans);
std::string PlanText(const Plan& p);
std::string SearchText(const std::vector<Plan>& plans);

}  // namespace strata::tools::plan
