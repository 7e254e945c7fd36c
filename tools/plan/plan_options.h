// `strata plan`'s command line: its own flags (the cluster and the device), beside `strata train`'s (the
// model, the config and its overrides), which mean what they mean to `strata train`; and the output.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/flags.h"
#include "tools/plan/plan.h"

namespace strata::tools::plan {

struct PlanRequest {
  PlanInput in;
  bool search = false;
  bool json = false;
};

std::vector<spec::FlagDef> PlanFlagDefs();  // the plan's own (not strata train's)
// --model-family NAME (spec/registry.h; default: the default family) chooses whose trainer flags these are.
absl::StatusOr<PlanRequest> ParsePlanArgs(std::vector<std::string> args);

// One JSON object per plan (schema in docs/decisions/0017-strata-plan.md); --search: {"candidates": [...]}.
std::string PlanJson(const Plan& p);
std::string SearchJson(const std::vector<Plan>& plans);
std::string PlanText(const Plan& p);
std::string SearchText(const std::vector<Plan>& plans);

}  // namespace strata::tools::plan
