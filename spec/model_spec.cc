#include "spec/model_spec.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace strata::spec {
namespace {

std::string UseName(const std::vector<UnitSpec>& units, bool backward, int unit) {
  const bool known = unit >= 0 && static_cast<size_t>(unit) < units.size();
  return absl::StrCat(backward ? "backward" : "forward", " of unit ", unit, known ? " '" : "",
                      known ? units[static_cast<size_t>(unit)].name : "", known ? "'" : " (no such unit)");
}

}  // namespace

absl::Status CheckUses(const ModelSpec& model, int micro_batch, const std::vector<device::Span>& spans) {
  const std::vector<UnitSpec> units = model.Units();
  const StepUses uses = model.Uses(micro_batch);
  struct Expected {
    bool backward;
    int unit;
  };
  std::vector<Expected> order;
  for (const UnitUse& u : uses.forward) order.push_back({false, u.unit});
  for (const UnitUse& u : uses.backward) order.push_back({true, u.unit});
  // `reduces`: the unit's last backward use of the micro-batch, and only that one.
  std::map<int, size_t> last;
  for (size_t i = 0; i < uses.backward.size(); ++i) last[uses.backward[i].unit] = i;
  for (size_t i = 0; i < uses.backward.size(); ++i) {
    const UnitUse& u = uses.backward[i];
    if (u.reduces != (last[u.unit] == i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's schedule (ModelSpec::Uses) marks backward use ", i + 1, " (", UseName(units, true, u.unit),
          ") as ", u.reduces ? "" : "not ", "the one its gradient is complete after, but it is ",
          u.reduces ? "not " : "", "the unit's last backward use"));
    }
  }
  std::vector<Expected> called;
  for (const device::Span& s : spans) {
    if (s.stream == "compute" && (s.kind == "forward" || s.kind == "backward")) {
      called.push_back({s.kind == "backward", s.unit});
    }
  }
  if (order.empty() || called.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no uses to compare: the model's schedule has ", order.size(),
                                                   ", the trainer called ", called.size()));
  }
  for (size_t i = 0; i < called.size(); ++i) {
    const Expected& want = order[i % order.size()];
    const Expected& got = called[i];
    if (want.backward != got.backward || want.unit != got.unit) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model's schedule (ModelSpec::Uses) differs from the hooks its trainer called: use ",
                       i % order.size() + 1, " of micro-batch ", i / order.size() + 1, " is ",
                       UseName(units, want.backward, want.unit), " in the schedule, but the trainer called ",
                       UseName(units, got.backward, got.unit)));
    }
  }
  if (called.size() % order.size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's schedule (ModelSpec::Uses) differs from the hooks its trainer called: the schedule has ",
        order.size(), " uses a micro-batch, the trainer ended after ", called.size() % order.size(), " of micro-batch ",
        called.size() / order.size() + 1, " (", called.size(), " in all)"));
  }
  return absl::OkStatus();
}

}  // namespace strata::spec
