// The strata CLI's subcommands. Each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace strata::tools {

int TrainCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
int BenchStepCommand(const std::vector<std::string>& args);
int PlotCommand(const std::vector<std::string>& args);
int CompareCommand(const std::vector<std::string>& args);
int CkptCommand(const std::vector<std::string>& args);
int BenchCapacityCommand(const std::vector<std::string>& args);
int BenchCommCommand(const std::vector<std::string>& args);
int DoctorCommand(const std::vector<std::string>& args);
int BenchScalingCommand(const std::vector<std::string>& args);
int BenchNvmeCommand(const std::vector<std::string>& args);

}  // namespace strata::tools
