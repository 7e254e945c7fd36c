// `strata compare A.safetensors B.safetensors [--rtol R] [--exclude NAME[B:E],...]`: are two weight files
// the same model within a relative tolerance? Per tensor, |a - b| <= rtol * max(|b|, rms(b)) element-wise
// (the tensor's own scale is the floor, so elements passing near zero are judged on the tensor's scale).
// --exclude leaves element ranges out, e.g. GPT-2's key biases, whose gradient is zero in exact arithmetic
// (softmax ignores a constant added to a row of scores) so that Adam turns fp32 rounding noise of either
// sign into updates of up to lr: they differ between any two summation orders and affect nothing else.
// --per-tensor judges each tensor by its relative L2 error ||a - b|| / ||b|| instead: Adam turns the
// rounding differences of an occasional near-zero gradient into an element-wise outlier, which a per-tensor
// norm weighs by its share of the tensor. Both measures are always printed. Exit 0 when the files match.
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/safetensors.h"
#include "spec/flags.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Exclusions = std::multimap<std::string, std::pair<size_t, size_t>>;

absl::StatusOr<Exclusions> ParseExclusions(const std::string& text) {
  Exclusions out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t open = item.find('['), colon = item.find(':'), close = item.find(']');
    size_t b = 0, e = 0;
    if (open == absl::string_view::npos || colon < open || close < colon ||
        !absl::SimpleAtoi(item.substr(open + 1, colon - open - 1), &b) ||
        !absl::SimpleAtoi(item.substr(colon + 1, close - colon - 1), &e) || e < b) {
      return absl::InvalidArgumentError(absl::StrCat("--exclude '", item, "': use NAME[BEGIN:END]"));
    }
    out.emplace(std::string(item.substr(0, open)), std::make_pair(b, e));
  }
  return out;
}

bool Excluded(const Exclusions& ex, const std::string& name, size_t i) {
  auto [lo, hi] = ex.equal_range(name);
  for (auto it = lo; it != hi; ++it) {
    if (i >= it->second.first && i < it->second.second) return true;
  }
  return false;
}

absl::StatusOr<bool> Compare(const std::string& a_path, const std::string& b_path, double rtol,
                             const Exclusions& ex, bool per_tensor) {
  STRATA_ASSIGN_OR_RETURN(auto a, checkpoint::SafetensorsReader::Open(a_path));
  STRATA_ASSIGN_OR_RETURN(auto b, checkpoint::SafetensorsReader::Open(b_path));
  if (a.tensors().size() != b.tensors().size()) {
    std::printf("different tensor counts: %zu vs %zu\n", a.tensors().size(), b.tensors().size());
    return false;
  }
  bool ok = true;
  double worst = 0, worst_l2 = 0;
  std::string worst_name, worst_l2_name;
  for (const auto& ta : a.tensors()) {
    const auto* tb = b.Find(ta.name);
    if (tb == nullptr || tb->shape != ta.shape) {
      std::printf("tensor '%s' is missing or has another shape in %s\n", ta.name.c_str(), b_path.c_str());
      ok = false;
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> va, a.ReadF32(ta));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> vb, b.ReadF32(*tb));
    double sq = 0;
    for (float v : vb) sq += double(v) * v;
    const double rms = std::sqrt(sq / std::max<size_t>(1, vb.size()));
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      if (Excluded(ex, ta.name, i)) continue;
      diff2 += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
      ref2 += double(vb[i]) * vb[i];
      const double err = std::fabs(double(va[i]) - vb[i]) / std::max({std::fabs(double(vb[i])), rms, 1e-30});
      if (!(err <= worst)) {
        worst = err;
        worst_name = absl::StrCat(ta.name, "[", i, "]");
      }
    }
    const double l2 = std::sqrt(diff2 / std::max(ref2, 1e-300));
    if (!(l2 <= worst_l2)) {
      worst_l2 = l2;
      worst_l2_name = ta.name;
    }
  }
  const double measure = per_tensor ? worst_l2 : worst;
  std::printf("compare: %zu tensors, max element-wise relative difference %.3g at %s, max per-tensor relative L2 "
              "%.3g in %s; %s <= %.3g: %s\n",
              a.tensors().size(), worst, worst_name.c_str(), worst_l2, worst_l2_name.c_str(),
              per_tensor ? "per-tensor" : "element-wise", rtol, ok && measure <= rtol ? "match" : "DIFFER");
  return ok && measure <= rtol;
}

const std::vector<spec::FlagDef>& CompareFlagDefs() {
  static const auto* defs =
      new std::vector<spec::FlagDef>{{"rtol", false, "relative tolerance (default 1e-5)"},
                                     {"exclude", false, "element ranges to skip: NAME[BEGIN:END],..."},
                                     {"per-tensor", true, "judge tensors by relative L2 error"}};
  return *defs;
}

}  // namespace

std::string CompareUsage() {
  return spec::Flags::Usage("compare", CompareFlagDefs(), "A.safetensors B.safetensors") +
         "  exit status: 0 equal within the tolerance, 1 different, 2 bad usage or unreadable file\n";
}

int CompareCommand(const std::vector<std::string>& args) {
  auto f = spec::Flags::Parse(args, CompareFlagDefs());
  if (!f.ok() || f->positional().size() != 2) {
    std::fprintf(stderr, "%s%s\n", CompareUsage().c_str(), f.ok() ? "" : std::string(f.status().message()).c_str());
    return 2;
  }
  auto rtol = f->Double("rtol", 1e-5);
  auto ex = ParseExclusions(f->Str("exclude"));
  auto same = !rtol.ok() ? rtol.status()
              : !ex.ok() ? ex.status()
                         : Compare(f->positional()[0], f->positional()[1], *rtol, *ex, f->Bool("per-tensor"));
  if (!same.ok()) {
    std::fprintf(stderr, "strata compare: %s\n", std::string(same.status().message()).c_str());
    return 2;
  }
  return *same ? 0 : 1;
}

}  // namespace strata::tools
