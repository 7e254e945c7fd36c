// `strata bench scaling --ranks N [--mpirun CMD] [--json] [train / bench step flags]`: see bench_scaling.h.
// Run it without a launcher: it starts `CMD -n 1 <this binary> bench step --json ...` and then `-n N`.
// CMD is split on spaces (e.g. "srun --mpi=pmix", or scripts/mpirun_local on a container as root).
#include "tools/bench/bench_scaling.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/base/env.h"
#include "runtime/base/status.h"
#include "spec/registry.h"
#include "tools/bench/subprocess.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using json = nlohmann::json;

std::vector<spec::FlagDef> ScalingFlagDefs() {
  return {{"ranks", false, "N: compare 1 rank against N ranks (N >= 2)"},
          {"mpirun", false, "launcher command, split on spaces (default mpirun)"},
          {"json", true, "print one JSON object"}};
}

struct ScalingOptions {
  int ranks = 0;
  std::vector<std::string> launcher;
  bool json = false;
  std::vector<std::string> step_args;  // forwarded to `bench step`
};

absl::StatusOr<ScalingOptions> ParseScalingOptions(const std::vector<std::string>& args) {
  std::vector<std::string> checked = args;  // --model-family goes on to bench step with the rest
  STRATA_ASSIGN_OR_RETURN(const spec::Family* family, spec::TakeFamily(&checked));
  std::vector<spec::FlagDef> all = ScalingFlagDefs();
  const std::vector<spec::FlagDef> train = family->TrainFlagDefs();
  all.insert(all.end(), train.begin(), train.end());
  STRATA_ASSIGN_OR_RETURN(spec::Flags f, spec::Flags::Parse(checked, all));  // catch typos before launching anything
  if (!f.positional().empty())
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f.positional()[0], "'"));
  ScalingOptions o;
  STRATA_ASSIGN_OR_RETURN(int64_t ranks, f.Int("ranks", 0));
  if (ranks < 2 || ranks > 4096) return absl::InvalidArgumentError("--ranks N is required, with 2 <= N <= 4096");
  o.ranks = static_cast<int>(ranks);
  o.launcher = absl::StrSplit(f.Str("mpirun", "mpirun"), ' ', absl::SkipEmpty());
  if (o.launcher.empty()) return absl::InvalidArgumentError("--mpirun is empty");
  o.json = f.Bool("json");
  for (size_t i = 0; i < args.size(); ++i) {
    const bool own_valued = args[i] == "--ranks" || args[i] == "--mpirun";
    const bool own = own_valued || args[i] == "--json" || args[i].rfind("--ranks=", 0) == 0 ||
                     args[i].rfind("--mpirun=", 0) == 0 || args[i].rfind("--json=", 0) == 0;
    if (!own) o.step_args.push_back(args[i]);
    if (own_valued) ++i;
  }
  return o;
}

double Field(const json& j, const char* name) {
  return j.contains(name) && j[name].is_number() ? j[name].get<double>() : -1;
}

// Runs `bench step --json` on n ranks and returns its JSON line (rank 0 prints exactly one).
absl::StatusOr<json> RunStep(const ScalingOptions& o, int n, const std::string& self) {
  std::vector<std::string> argv = o.launcher;
  argv.insert(argv.end(), {"-n", absl::StrCat(n), self, "bench", "step", "--json"});
  argv.insert(argv.end(), o.step_args.begin(), o.step_args.end());
  STRATA_ASSIGN_OR_RETURN(const std::string out, RunAndCapture(argv));
  for (const absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.empty() || line.front() != '{') continue;
    json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return j;
  }
  return absl::InternalError(absl::StrCat("bench step on ", n, " ranks printed no JSON line; output: ", out));
}

void PrintTable(const json& one, const json& many, const ScalingSummary& s) {
  std::printf("strata bench scaling: %s, %lld params, stage %d, micro-batch %d per rank (weak scaling)\n",
              one.value("model", std::string("?")).c_str(), one.value("params", 0LL), one.value("stage", -1),
              one.value("micro_batch", 0));
  std::printf("%5s  %9s  %10s  %15s  %18s\n", "ranks", "step ms", "samples/s", "samples/s/rank", "sgemm GFLOP/s/rank");
  for (const json* j : {&one, &many}) {
    const double ranks = Field(*j, "ranks"), samples = Field(*j, "tokens_per_s") / Field(*j, "seq_len");
    std::printf("%5.0f  %9.1f  %10.1f  %15.1f  %18.2f\n", ranks, Field(*j, "step_ms"), samples, samples / ranks,
                Field(*j, "sgemm_gflops_per_rank"));
  }
  std::printf("scaling efficiency at %d ranks: %.1f%% (samples/s per rank against 1 rank)\n", s.ranks,
              100 * s.efficiency);
  if (s.sgemm_ratio > 0) {
    // How much raw compute rate each rank keeps when all run at once: below 100%, ranks compete for cores
    // or memory bandwidth, and that part of the loss is not the step's. Below the ratio is the step's own.
    std::printf("per-rank sgemm rate at %d ranks: %.1f%% of 1 rank's%s%s\n", s.ranks, 100 * s.sgemm_ratio,
                s.sgemm_ratio < 0.9 ? " (ranks compete for cores or memory bandwidth)" : "",
                s.efficiency < s.sgemm_ratio ? "; the gap down to the efficiency is communication and waiting" : "");
  }
}

absl::Status RunScaling(const ScalingOptions& o) {
  if (env::LauncherWorldSize().value_or(1) > 1) {
    return absl::FailedPreconditionError("run strata bench scaling without mpirun: it launches the ranks itself");
  }
  STRATA_ASSIGN_OR_RETURN(const std::string self, SelfExecutable());
  STRATA_ASSIGN_OR_RETURN(const json one, RunStep(o, 1, self));
  STRATA_ASSIGN_OR_RETURN(const json many, RunStep(o, o.ranks, self));
  STRATA_ASSIGN_OR_RETURN(const ScalingSummary s, SummariseScaling(one, many));
  if (!o.json) {
    PrintTable(one, many, s);
    return absl::OkStatus();
  }
  const json out = {{"model", one.value("model", "")},  {"params", one.value("params", 0LL)},
                    {"stage", one.value("stage", -1)},   {"micro_batch", one.value("micro_batch", 0)},
                    {"seq_len", one.value("seq_len", 0)}, {"ranks", s.ranks},
                    {"samples_per_s_1", s.samples_per_s_1}, {"samples_per_s_per_rank_n", s.samples_per_s_per_rank_n},
                    {"scaling_efficiency", s.efficiency}, {"sgemm_ratio", s.sgemm_ratio},
                    {"one_rank", one},                   {"n_ranks", many}};
  std::printf("%s\n", out.dump().c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScalingSummary> SummariseScaling(const json& one, const json& many) {
  for (const json* j : {&one, &many}) {
    for (const char* key : {"ranks", "tokens_per_s", "seq_len"}) {
      if (Field(*j, key) <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("bench step output lacks a positive '", key, "': ", j->dump()));
      }
    }
  }
  for (const char* key : {"model", "micro_batch", "seq_len", "stage"}) {
    if (one.value(key, json()) != many.value(key, json())) {
      return absl::InvalidArgumentError(absl::StrCat("the 1-rank and N-rank runs differ in '", key, "'"));
    }
  }
  if (Field(one, "ranks") != 1) return absl::InvalidArgumentError("the first run is not on 1 rank");
  ScalingSummary s;
  s.ranks = static_cast<int>(Field(many, "ranks"));
  s.samples_per_s_1 = Field(one, "tokens_per_s") / Field(one, "seq_len");
  s.samples_per_s_per_rank_n = Field(many, "tokens_per_s") / Field(many, "seq_len") / s.ranks;
  s.efficiency = s.samples_per_s_per_rank_n / s.samples_per_s_1;
  const double g1 = Field(one, "sgemm_gflops_per_rank"), gn = Field(many, "sgemm_gflops_per_rank");
  s.sgemm_ratio = g1 > 0 && gn > 0 ? gn / g1 : 0;
  return s;
}

std::string BenchScalingUsage() {
  return spec::Flags::Usage("bench scaling", ScalingFlagDefs()) +
         "  (other flags go to strata bench step: --model-family, --model, --layers, --micro-batch, --steps, --stage,\n"
         "  ...)\n";
}

int BenchScalingCommand(const std::vector<std::string>& args) {
  auto opts = ParseScalingOptions(args);
  if (!opts.ok()) {
    std::fprintf(stderr, "strata bench scaling: %s\n%s", std::string(opts.status().message()).c_str(),
                 spec::Flags::Usage("bench scaling", ScalingFlagDefs()).c_str());
    return 2;
  }
  const absl::Status s = RunScaling(*opts);
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench scaling: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
