// A command of the strata CLI: its name, a line for `strata --help`, what runs it (the arguments after its
// name; returns the exit code) and its usage (`strata CMD --help`). The CLI's own commands are tools/'s
// (tools/cli/commands.h); a model family's (`strata train`, `strata generate`) register through
// spec/registry.h.
#pragma once

#include <string>
#include <vector>

namespace strata::spec {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
  std::string (*usage)();
};

}  // namespace strata::spec
