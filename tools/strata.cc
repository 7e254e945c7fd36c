// strata: the command-line front end.
//   strata train ...        train a GPT-2 on the engine (under mpirun for several ranks)
//   strata generate ...     sample from trained weights
//   strata bench step ...   training-step throughput against an sgemm rate measured in the same run
//   strata bench scaling --ranks N ...   samples/s per rank at 1 and N ranks, and the scaling efficiency
//   strata doctor [--json] [--nvme-path DIR]   check the machine before training
//   strata plot M.jsonl -o loss.png
//   strata compare A.safetensors B.safetensors [--rtol R]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace {

const char kUsage[] =
    "usage: strata <command> [flags]\n"
    "  train      train a GPT-2 (strata train --help for flags)\n"
    "  generate   sample text from trained weights\n"
    "  bench      step: training throughput; scaling: 1 rank against N ranks\n"
    "  doctor     check GPUs, interconnect, versions, host, NVMe, MPI and limits before training\n"
    "  plot       draw the loss curve of a metrics file as a PNG\n"
    "  compare    compare two weight files within a relative tolerance\n"
    "  ckpt       inspect [--verify] or export a checkpoint\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  using namespace strata::tools;
  if (cmd == "train") return TrainCommand(args);
  if (cmd == "generate") return GenerateCommand(args);
  if (cmd == "plot") return PlotCommand(args);
  if (cmd == "compare") return CompareCommand(args);
  if (cmd == "ckpt") return CkptCommand(args);
  if (cmd == "doctor") return DoctorCommand(args);
  if (cmd == "bench" && !args.empty() && args[0] == "step") return BenchStepCommand({args.begin() + 1, args.end()});
  if (cmd == "bench" && !args.empty() && args[0] == "scaling") return BenchScalingCommand({args.begin() + 1, args.end()});
  std::fprintf(stderr, "strata: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
