#include "spec/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/nearest.h"

namespace strata::spec {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const std::vector<FlagDef>& defs) {
  Flags f;
  std::vector<std::string> names;
  for (const FlagDef& d : defs) names.push_back(d.name);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      f.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagDef* def = nullptr;
    for (const FlagDef& d : defs) def = d.name == name ? &d : def;
    if (def == nullptr) {
      const auto near = NearestMatch(name, names);
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name,
                                                     near ? absl::StrCat("; did you mean --", *near, "?") : ""));
    }
    if (def->boolean) {
      if (inline_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value (or =true / =false)"));
      }
      if (!inline_value || value == "true") f.values_[name] = "true";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      value = args[++i];
    }
    f.values_[name] = value;
  }
  return f;
}

std::string Flags::Str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " needs an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> Flags::IntIn(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  absl::StatusOr<int64_t> v = Int(name, fallback);
  if (v.ok() && Has(name) && (*v < lo || *v > hi)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " ", *v, " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<double> Flags::Double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a number, got '", it->second, "'"));
  }
  return v;
}

std::string Flags::Usage(const std::string& command, const std::vector<FlagDef>& defs, const std::string& operands) {
  std::string out = absl::StrCat("usage: strata ", command, operands.empty() ? "" : " ", operands, " [flags]\n");
  for (const FlagDef& d : defs) {
    const std::string left = absl::StrCat(d.name.size() == 1 ? "-" : "--", d.name, d.boolean ? "" : " V");
    absl::StrAppend(&out, "  ", left, std::string(left.size() < 28 ? 28 - left.size() : 1, ' '), d.help, "\n");
  }
  return out;
}

}  // namespace strata::spec
