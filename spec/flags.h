// Command-line flags of the strata CLI and of the model families' trainers (spec/family.h): "--name value",
// "--name=value", boolean "--name", positional arguments. Every flag must be declared; an unknown one is an
// error naming the nearest declared flag.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::spec {

struct FlagDef {
  std::string name;  // without the dashes
  bool boolean = false;
  std::string help;
};

class Flags {
 public:
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args, const std::vector<FlagDef>& defs);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Str(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  // Int, and an error naming the flag and [lo, hi] when the value lies outside (the fallback is not checked).
  absl::StatusOr<int64_t> IntIn(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;
  bool Bool(const std::string& name) const { return Has(name); }
  const std::vector<std::string>& positional() const { return positional_; }

  static std::string Usage(const std::string& command, const std::vector<FlagDef>& defs,
                           const std::string& operands = "");

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace strata::spec
