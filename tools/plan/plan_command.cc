// `strata plan`: the command. Runs on one process: no MPI, no device, nothing allocated for the model.
#include <cstdio>

#include "spec/registry.h"
#include "tools/cli/commands.h"
#include "tools/plan/plan_options.h"

namespace strata::tools {

std::string PlanUsage() {
  std::string s =
      "usage: strata plan [--search] [--json] [plan flags] [strata train's flags]\n"
      "  per-rank memory by tier (the engine's own accounting, nothing allocated), the step time split and the\n"
      "  largest micro-batch that fits, for a registered model (--model-family NAME: the GPT by default, with\n"
      "  --model or its dimensions; another family with its own flags, listed at the end) on --ranks ranks of a\n"
      "  device preset under a Strata config (--config and strata train's flags). Plan flags:\n";
  for (const spec::FlagDef& d : plan::PlanFlagDefs()) {
    s += "  --" + d.name + std::string(d.name.size() < 22 ? 22 - d.name.size() : 1, ' ') + d.help + "\n";
  }
  return s + spec::FamilyFlagUsage() +
         "  strata train --help lists the rest (--model, --stage, --micro-batch, --param-dtype, ...).\n" +
         spec::OtherFamiliesUsage();
}

int PlanCommand(const std::vector<std::string>& args) {
  absl::StatusOr<plan::PlanRequest> r = plan::ParsePlanArgs(args);
  if (!r.ok()) {
    std::fprintf(stderr, "strata plan: %s\n", std::string(r.status().message()).c_str());
    return 2;
  }
  if (r->search) {
    absl::StatusOr<std::vector<plan::Plan>> plans = plan::Search(r->in);
    if (!plans.ok()) {
      std::fprintf(stderr, "strata plan: %s\n", std::string(plans.status().message()).c_str());
      return 1;
    }
    std::fputs((r->json ? plan::SearchJson(*plans) : plan::SearchText(*plans)).c_str(), stdout);
    return 0;
  }
  absl::StatusOr<plan::Plan> p = plan::Evaluate(r->in);
  if (!p.ok()) {
    std::fprintf(stderr, "strata plan: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  std::fputs((r->json ? plan::PlanJson(*p) : plan::PlanText(*p)).c_str(), stdout);
  return 0;  // "does not fit" is an answer too (memory.fits says which)
}

}  // namespace strata::tools
