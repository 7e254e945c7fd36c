// strata: the command-line front end. One table names every command and subcommand, what it does and its
// usage: the model families' commands (registered through spec/registry.h: the GPT's train and generate)
// first, then the CLI's own; `strata --help`, `strata bench --help` and the usage errors are printed from
// it, and `--help` (or -h) anywhere among a command's arguments prints that command's usage and exits 0
// before anything runs: no MPI start, no benchmark (tests/tools/cli/help_cli.sh walks the table).
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "spec/command.h"
#include "spec/registry.h"
#include "tools/bench/bench_adam.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Args = std::vector<std::string>;
using spec::Command;

// `strata bench adam` parses argv after its command name (it is also a standalone binary).
int BenchAdam(const Args& args) {
  std::vector<char*> av = {const_cast<char*>("strata bench adam")};
  for (const std::string& a : args) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  return RunBenchAdam(static_cast<int>(av.size()) - 1, av.data());
}

const Command kBench[] = {
    {"step", "training-step throughput against an sgemm rate measured in the same run", BenchStepCommand,
     BenchStepUsage},
    {"scaling", "samples/s per rank at 1 and N ranks, and the scaling efficiency", BenchScalingCommand,
     BenchScalingUsage},
    {"nvme", "NVMe store read/write throughput against fio in the same run", BenchNvmeCommand, BenchNvmeUsage},
    {"capacity", "the largest GPT within --device-budget / --host-budget", BenchCapacityCommand, BenchCapacityUsage},
    {"adam", "host AdamW throughput against a same-run triad", BenchAdam, BenchAdamUsage},
    {"comm", "the MPI back-end's collectives against raw MPI", BenchCommCommand, BenchCommUsage},
};

std::string BenchUsage();
int Bench(const Args& args);

const Command kOwn[] = {
    {"bench", "benchmarks: step, scaling, nvme, capacity, adam, comm", Bench, BenchUsage},
    {"doctor", "check GPUs, interconnect, versions, host, NVMe, MPI and limits before training", DoctorCommand,
     DoctorUsage},
    {"plan", "will a model fit a cluster, and how fast: per-rank memory by tier and the step time", PlanCommand,
     PlanUsage},
    {"plot", "draw the loss curves of a metrics file as an SVG", PlotCommand, PlotUsage},
    {"compare", "compare two weight files within a relative tolerance", CompareCommand, CompareUsage},
    {"ckpt", "inspect [--verify] or export a checkpoint", CkptCommand, CkptUsage},
};

// The model families' commands, then the CLI's own.
std::vector<Command> Commands() {
  std::vector<Command> all = spec::RegisteredCommands();
  all.insert(all.end(), std::begin(kOwn), std::end(kOwn));
  return all;
}

template <typename Table>
std::string List(const char* head, const Table& table, const char* tail) {
  std::string out = head;
  for (const Command& c : table) {
    std::string name = c.name;
    out += "  " + name + std::string(name.size() < 10 ? 10 - name.size() : 1, ' ') + " " + c.summary + "\n";
  }
  return out + tail;
}

std::string Usage() {
  return List("usage: strata <command> [flags]\n", Commands(), "strata <command> --help prints a command's flags.\n");
}

std::string BenchUsage() {
  return List("usage: strata bench <benchmark> [flags]\n", kBench,
              "strata bench <benchmark> --help prints a benchmark's flags.\n");
}

bool WantsHelp(const Args& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

template <typename Table>
int Dispatch(const char* what, const Table& table, const Args& args, std::string (*usage)()) {
  if (args.empty()) {
    std::fputs(usage().c_str(), stderr);
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  const Args rest(args.begin() + 1, args.end());
  for (const Command& c : table) {
    if (args[0] != c.name) continue;
    if (WantsHelp(rest) && c.run != Bench) {
      std::fputs(c.usage().c_str(), stdout);
      return 0;
    }
    return c.run(rest);
  }
  std::fprintf(stderr, "strata: unknown %s '%s'\n%s", what, args[0].c_str(), usage().c_str());
  return 2;
}

int Bench(const Args& args) { return Dispatch("benchmark", kBench, args, BenchUsage); }

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  using namespace strata::tools;
  return Dispatch("command", Commands(), Args(argv + 1, argv + argc), Usage);
}
