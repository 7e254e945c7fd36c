// The GPT's own commands, registered with the CLI through spec/registry.h (gpt_register.cc). Each takes
// the arguments after its name and returns the exit code; its usage is what `strata CMD --help` prints.
#pragma once

#include <string>
#include <vector>

namespace strata::tools {

int TrainCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
std::string TrainUsage();
std::string GenerateUsage();

}  // namespace strata::tools
