// The strata CLI's own commands. Each takes the arguments after its name and returns the exit code. A model
// family's commands (the GPT's `strata train`, `strata generate`) register through spec/registry.h.
#pragma once

#include <string>
#include <vector>

namespace strata::tools {

int BenchStepCommand(const std::vector<std::string>& args);
int PlotCommand(const std::vector<std::string>& args);
int CompareCommand(const std::vector<std::string>& args);
int CkptCommand(const std::vector<std::string>& args);
int BenchCapacityCommand(const std::vector<std::string>& args);
int BenchCommCommand(const std::vector<std::string>& args);
int DoctorCommand(const std::vector<std::string>& args);
int BenchScalingCommand(const std::vector<std::string>& args);
int BenchNvmeCommand(const std::vector<std::string>& args);
int PlanCommand(const std::vector<std::string>& args);

// Each command's usage, printed by `strata CMD --help` (tools/cli/strata.cc answers --help for every command
// before running it, so asking for help never starts a job or a benchmark).
std::string BenchStepUsage();
std::string PlotUsage();
std::string CompareUsage();
std::string CkptUsage();
std::string BenchCapacityUsage();
std::string BenchCommUsage();
std::string DoctorUsage();
std::string BenchScalingUsage();
std::string BenchNvmeUsage();
std::string PlanUsage();

}  // namespace strata::tools
