// strata: the command-line front end.
//   strata train ...        train a GPT-2 on the engine (under mpirun for several ranks)
//   strata generate ...     sample from trained weights
//   strata bench step ...   training-step throughput against an sgemm rate measured in the same run
//   strata bench scaling --ranks N ...   samples/s per rank at 1 and N ranks, and the scaling efficiency
//   strata bench nvme --path DIR ...   NVMe store read/write throughput against fio in the same run
//   strata doctor [--json] [--nvme-path DIR]   check the machine before training
//   strata plot M.jsonl -o loss.png
//   strata compare A.safetensors B.safetensors [--rtol R]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/bench_adam.h"
#include "tools/commands.h"

namespace {

const char kUsage[] =
    "usage: strata <command> [flags]\n"
    "  train      train a GPT-2 (strata train --help for flags)\n"
    "  generate   sample text from trained weights\n"
    "  bench      step: training throughput; scaling: 1 rank against N ranks; nvme: NVMe store vs fio;\n"
    "             capacity: the largest GPT within --device-budget / --host-budget;\n"
    "             adam: host AdamW throughput against a same-run triad;\n"
    "             comm: the MPI back-end's collectives against raw MPI\n"
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
  if (cmd == "bench" && !args.empty() && args[0] == "adam") {
    std::vector<char*> av = {argv[0]};  // RunBenchAdam parses argv after its command name
    for (int i = 3; i < argc; ++i) av.push_back(argv[i]);
    av.push_back(nullptr);
    return strata::tools::RunBenchAdam(static_cast<int>(av.size()) - 1, av.data());
  }
  if (cmd == "bench" && !args.empty() && args[0] == "comm") return BenchCommCommand({args.begin() + 1, args.end()});
  if (cmd == "bench" && !args.empty() && args[0] == "capacity") {
    return BenchCapacityCommand({args.begin() + 1, args.end()});
  }
  if (cmd == "bench" && !args.empty() && args[0] == "scaling") return BenchScalingCommand({args.begin() + 1, args.end()});
  if (cmd == "bench" && !args.empty() && args[0] == "nvme") return BenchNvmeCommand({args.begin() + 1, args.end()});
  std::fprintf(stderr, "strata: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
