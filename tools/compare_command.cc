// `strata compare A.safetensors B.safetensors [--rtol R]`: are two weight files the same model within a
// relative tolerance? Per tensor, |a - b| <= rtol * max(|b|, rms(b)) element-wise (the tensor's own scale
// is the floor, so elements passing near zero are judged on the tensor's scale). Exit 0 when they match.
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/safetensors.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace strata::tools {
namespace {

absl::StatusOr<bool> Compare(const std::string& a_path, const std::string& b_path, double rtol) {
  STRATA_ASSIGN_OR_RETURN(auto a, checkpoint::SafetensorsReader::Open(a_path));
  STRATA_ASSIGN_OR_RETURN(auto b, checkpoint::SafetensorsReader::Open(b_path));
  if (a.tensors().size() != b.tensors().size()) {
    std::printf("different tensor counts: %zu vs %zu\n", a.tensors().size(), b.tensors().size());
    return false;
  }
  bool ok = true;
  double worst = 0;
  std::string worst_name;
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
    for (size_t i = 0; i < va.size(); ++i) {
      const double err = std::fabs(double(va[i]) - vb[i]) / std::max({std::fabs(double(vb[i])), rms, 1e-30});
      if (!(err <= worst)) {
        worst = err;
        worst_name = absl::StrCat(ta.name, "[", i, "]");
      }
    }
  }
  std::printf("compare: %zu tensors, max relative difference %.3g at %s, rtol %.3g: %s\n", a.tensors().size(), worst,
              worst_name.c_str(), rtol, ok && worst <= rtol ? "match" : "DIFFER");
  return ok && worst <= rtol;
}

}  // namespace

int CompareCommand(const std::vector<std::string>& args) {
  auto f = Flags::Parse(args, {{"rtol", false, "relative tolerance (default 1e-5)"}});
  if (!f.ok() || f->positional().size() != 2) {
    std::fprintf(stderr, "usage: strata compare A.safetensors B.safetensors [--rtol R]\n%s\n",
                 f.ok() ? "" : std::string(f.status().message()).c_str());
    return 2;
  }
  auto rtol = f->Double("rtol", 1e-5);
  auto same = rtol.ok() ? Compare(f->positional()[0], f->positional()[1], *rtol) : rtol.status();
  if (!same.ok()) {
    std::fprintf(stderr, "strata compare: %s\n", std::string(same.status().message()).c_str());
    return 2;
  }
  return *same ? 0 : 1;
}

}  // namespace strata::tools
