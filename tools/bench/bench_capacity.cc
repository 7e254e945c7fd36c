// `strata bench capacity --device-budget X --host-budget Y [--nvme-path P] [--vary layers|width]`: the
// largest model (the GPT's by default; any model family's through spec/family.h) that completes 3 steps
// within the budgets. Its depth at fixed width (or width at fixed depth; ModelSpec::Grows) grows by doubling
// until a run fails, then a binary search between the last success and the first failure; with NVMe
// offload the first candidate is the largest the engine's accounting predicts to fit (Note [Capacity
// search], capacity_search.h).
//
// Each candidate prints a line as it starts (its size and an estimate of its time, from the last one that
// fitted, scaled by parameters) and as it ends (fits or why not, step time, peak bytes per tier), and is
// appended to --results as one JSON line (Note [Interrupted search], capacity_results.h). --max-params and
// --time-limit bound the search. At the end: a table of every candidate; for the largest model its
// parameters, peak bytes per tier, step time and its split; the physical bound of the box and the I/O floor
// of the step (capacity_bound.h).
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "spec/family.h"
#include "spec/launch.h"
#include "spec/registry.h"
#include "tools/bench/capacity_bound.h"
#include "tools/bench/capacity_results.h"
#include "tools/bench/capacity_search.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct SearchOptions {
  bool width = false;
  int64_t max_params = 0;   // 0 = no bound
  double time_limit_s = 0;  // 0 = no limit
  std::string results;      // JSON-lines file, "" = none
  uint64_t probe_bytes = 64ull << 20;
  uint64_t disk_reserve = 2ull << 30;  // free disk the predicted first candidate leaves unused
};

struct Attempt {
  int64_t k = 0;  // its size in the direction that grows (ModelSpec::Grows): the GPT's layers, or d_model / heads
  std::shared_ptr<const spec::ModelSpec> model;
  bool fits = false;
  std::string why;
  int64_t params = 0;
  double step_ms = 0;  // the last of the steps: the first ones warm the caches
  double seconds = 0;  // bring-up, steps and teardown
  engine::StepResult last;
  engine::MemoryStats mem;
};

// What the search runs: the family that brings the candidates up, and its setup of the base model.
struct Base {
  const spec::Family* family = nullptr;
  std::unique_ptr<spec::TrainSetup> setup;
};

absl::Status Try(const Base& o, comm::Communicator& world, int steps, Attempt& a) {
  a.params = a.model->NumParams();
  device::HostDevice dev;
  absl::StatusOr<std::unique_ptr<spec::Trainer>> run =
      o.family->BringUp(*a.model, o.setup->engine, world, dev, /*compute=*/nullptr);
  if (absl::IsResourceExhausted(run.status())) {  // Finalize found that it does not fit the budgets
    a.why = std::string(run.status().message());
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(run.status());
  engine::Engine& e = (*run)->engine();
  (*run)->SynthesizeTokens(7, o.setup->engine.train_micro_batch_size_per_gpu);
  for (int i = 0; i < steps; ++i) {  // one micro-batch a step, whatever the accumulation
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR((*run)->RunMicroBatches(1, o.setup->checkpointing).status());
    STRATA_ASSIGN_OR_RETURN(a.last, e.Step());
    a.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  a.fits = true;
  a.mem = e.memory_stats();
  return absl::OkStatus();
}

std::string Peaks(const engine::MemoryStats& mem) {
  std::string s;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    absl::StrAppend(&s, t ? ", " : "", memory::TierName(static_cast<memory::Tier>(t)), " ",
                    FormatBytes(mem.tier[t].peak_bytes));
  }
  return s;
}

nlohmann::json ToJson(const Attempt& a) {
  nlohmann::json j = {{"params", a.params}, {"fits", a.fits}, {"seconds", a.seconds}};
  for (const spec::Dimension& d : a.model->Dimensions()) j[d.name] = d.value;
  if (!a.fits) {
    j["why"] = a.why;
    return j;
  }
  j["step_ms"] = a.step_ms;
  j["split_ms"] = {{"compute", a.last.compute_ms}, {"exposed_comm", a.last.exposed_comm_ms},
                   {"exposed_io", a.last.exposed_io_ms}, {"optimizer", a.last.optimizer_ms}};
  j["nvme_read_bytes"] = a.last.nvme_read_bytes;
  j["nvme_write_bytes"] = a.last.nvme_write_bytes;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    j["peak_bytes"][std::string(memory::TierName(static_cast<memory::Tier>(t)))] = a.mem.tier[t].peak_bytes;
  }
  return j;
}

// The model's first two dimensions (spec::Dimension; the GPT's layers and d_model), the table's columns.
std::array<spec::Dimension, 2> Columns(const spec::ModelSpec& m) {
  std::array<spec::Dimension, 2> c;
  const std::vector<spec::Dimension> d = m.Dimensions();
  for (size_t i = 0; i < c.size() && i < d.size(); ++i) c[i] = d[i];
  return c;
}

void PrintTable(const std::vector<Attempt>& all) {
  const std::array<spec::Dimension, 2> head = Columns(*all.front().model);
  std::printf("candidates (in the order tried):\n  %6s %8s %14s  %-5s %10s  %s\n", head[0].name.c_str(),
              head[1].name.c_str(), "params", "fits", "step ms", "peaks, or why not");
  for (const Attempt& a : all) {
    char step[32] = "-";
    if (a.fits) std::snprintf(step, sizeof step, "%.1f", a.step_ms);
    const std::array<spec::Dimension, 2> c = Columns(*a.model);
    std::printf("  %6lld %8lld %14lld  %-5s %10s  %s\n", static_cast<long long>(c[0].value),
                static_cast<long long>(c[1].value), static_cast<long long>(a.params), a.fits ? "yes" : "no", step,
                a.fits ? Peaks(a.mem).c_str() : a.why.substr(0, 100).c_str());
  }
}

void PrintLargest(const Attempt& best) {
  std::printf("largest model within the budgets: %s, %lld parameters\n", best.model->Describe().c_str(),
              static_cast<long long>(best.params));
  for (int t = 0; t < memory::kNumTiers; ++t) {
    std::printf("  peak %-12s %s\n", std::string(memory::TierName(static_cast<memory::Tier>(t))).c_str(),
                FormatBytes(best.mem.tier[t].peak_bytes).c_str());
  }
  std::printf("  step %.1f ms: compute %.1f, exposed communication %.1f, exposed I/O %.1f, optimizer %.1f\n",
              best.step_ms, best.last.compute_ms, best.last.exposed_comm_ms, best.last.exposed_io_ms,
              best.last.optimizer_ms);
  // Measured by the engine over the last step: parameter shards not served by the cache, and the tiled
  // optimizer update (Notes [NVMe params] and [NVMe state]).
  std::printf("  NVMe bytes per step: %s read, %s written\n", FormatBytes(best.last.nvme_read_bytes).c_str(),
              FormatBytes(best.last.nvme_write_bytes).c_str());
}

struct Search {
  std::vector<Attempt> all;
  int best = -1;        // index into `all` of the largest that fitted
  std::string stopped;  // why the search ended early, "" when it converged
};

// Seconds the next candidate should take: the last fitted one's, scaled by parameters (0: no estimate).
double Estimate(const Search& s, int64_t params) {
  if (s.best < 0) return 0;
  const Attempt& b = s.all[static_cast<size_t>(s.best)];
  return b.seconds * static_cast<double>(params) / static_cast<double>(std::max<int64_t>(b.params, 1));
}

// Rank 0's decision, the same on every rank (the ranks must run the same candidates: Finalize is collective).
absl::StatusOr<bool> Agreed(comm::Communicator& world, device::Stream& stream, bool decision) {
  if (world.size() == 1) return decision;
  float v = decision ? 1.0f : 0.0f;
  STRATA_RETURN_IF_ERROR(comm::BroadcastBytes(world, &v, sizeof v, 0, stream).Wait());
  return v != 0;
}

void PrintOutcome(const Attempt& a) {
  if (!a.fits) {
    std::printf("  does not fit (%.1f s): %s\n", a.seconds, a.why.c_str());
  } else {
    std::printf(
        "  fits (%.1f s): step %.1f ms (compute %.1f, exposed I/O %.1f, optimizer %.1f); peaks: %s; "
        "NVMe per step %s read, %s written\n",
        a.seconds, a.step_ms, a.last.compute_ms, a.last.exposed_io_ms, a.last.optimizer_ms, Peaks(a.mem).c_str(),
        FormatBytes(a.last.nvme_read_bytes).c_str(), FormatBytes(a.last.nvme_write_bytes).c_str());
  }
  std::fflush(stdout);
}

// Runs one candidate of size k unless a bound stops it: *ran tells which. Rank 0 reports and records it.
absl::Status Candidate(const Base& o, const SearchOptions& so, comm::Communicator& world, device::Stream& stream,
                       double elapsed, CapacityResults& results, Attempt a, Search& s, bool* ran) {
  *ran = false;
  const bool rank0 = world.rank() == 0;
  const std::string name =
      absl::StrCat("candidate ", s.all.size() + 1, ": ", a.model->Shape(), ", ", a.params, " parameters");
  if (so.max_params > 0 && a.params > so.max_params) {
    if (rank0)
      std::printf("%s: over --max-params %lld, not tried\n", name.c_str(), static_cast<long long>(so.max_params));
    return absl::OkStatus();
  }
  const double est = Estimate(s, a.params);
  STRATA_ASSIGN_OR_RETURN(const bool go,
                          Agreed(world, stream, so.time_limit_s <= 0 || elapsed + est < so.time_limit_s));
  if (!go) {
    s.stopped = absl::StrCat("--time-limit ", so.time_limit_s, " s reached after ", static_cast<int64_t>(elapsed),
                             " s: ", name, " was estimated at ", static_cast<int64_t>(est), " s");
    return absl::OkStatus();
  }
  if (rank0) {
    std::printf(
        "%s, %s\n", name.c_str(),
        est > 0 ? absl::StrCat("estimated ", static_cast<int64_t>(est + 0.5), " s").c_str() : "no estimate yet");
    std::fflush(stdout);
  }
  const auto t0 = Clock::now();
  STRATA_RETURN_IF_ERROR(Try(o, world, 3, a));
  a.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rank0) {
    PrintOutcome(a);
    STRATA_RETURN_IF_ERROR(results.Append(ToJson(a)));
  }
  s.all.push_back(std::move(a));
  if (s.all.back().fits) s.best = static_cast<int>(s.all.size()) - 1;
  *ran = true;
  return absl::OkStatus();
}

absl::StatusOr<Search> RunSearch(const Base& o, const SearchOptions& so, comm::Communicator& world, uint64_t free_disk,
                                 CapacityResults& results) {
  const std::shared_ptr<const spec::ModelSpec>& base = o.setup->model;
  const engine::EngineConfig& config = o.setup->engine;
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto stream, dev.CreateStream("capacity"));
  const auto start = Clock::now();
  Search s;
  const spec::Growth grows = base->Grows(so.width);  // the base size, and the largest the model takes
  const int64_t base_k = grows.size, limit = grows.max;
  if (grows.max <= grows.size) {  // the MLP's depth is fixed
    return absl::InvalidArgumentError(absl::StrCat("the model (", base->Describe(), ") does not grow in ",
                                                   so.width ? "width" : "layers", " (its ", grows.what, " is fixed at ",
                                                   grows.size, "): pass --vary ", so.width ? "layers" : "width"));
  }
  // Note [Capacity search]: with NVMe, start at the accounting's largest fit.
  const bool use_prediction = !NvmePaths(config).empty();
  int64_t predicted = 0;
  PredictInput pin{base, config, so.width, world.size(), free_disk, so.disk_reserve, so.max_params};
  if (use_prediction) {
    STRATA_ASSIGN_OR_RETURN(predicted, PredictLargest(pin, limit));
    if (world.size() > 1) {  // rank 0's: the ranks' free disk may differ by the moment each read it
      STRATA_RETURN_IF_ERROR(comm::BroadcastBytes(world, &predicted, sizeof predicted, 0, *stream).Wait());
    }
    if (world.rank() == 0) {
      STRATA_ASSIGN_OR_RETURN(const std::string next, PredictedShortfall(pin, predicted + 1));
      std::printf(
          "the engine's accounting predicts the largest fit at %s (%lld parameters): the first candidate; "
          "%s does not fit: %s\n",
          predicted > 0 ? Scaled(base, so.width, predicted)->Shape().c_str() : "none",
          static_cast<long long>(predicted > 0 ? Scaled(base, so.width, predicted)->NumParams() : 0),
          Scaled(base, so.width, predicted + 1)->Shape().c_str(), next.c_str());
      std::fflush(stdout);
    }
  }
  CandidateState st = FirstCandidate(base_k, use_prediction, predicted);
  for (;;) {
    const int64_t k = st.k;
    if (k > grows.max) {  // past the largest the model takes (the GPT's dimensions stop at 2^30)
      return absl::InvalidArgumentError(absl::StrCat("the search passed the largest model the family takes (",
                                                     Scaled(base, so.width, grows.max)->Shape(),
                                                     ") without running out of memory: set --device-budget, "
                                                     "--host-budget or --max-params"));
    }
    Attempt a;
    a.k = k;
    a.model = Scaled(base, so.width, k);
    a.params = a.model->NumParams();
    bool ran = false;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    STRATA_RETURN_IF_ERROR(Candidate(o, so, world, *stream, elapsed, results, a, s, &ran));
    if (!s.stopped.empty()) break;
    const bool fitted = ran && s.all.back().fits;  // else: does not fit, or over --max-params
    if (!fitted && st.good == 0 && k == 1) {
      return absl::ResourceExhaustedError(ran ? absl::StrCat("not even the smallest model fits: ", s.all.back().why)
                                              : "not even the smallest model is within --max-params");
    }
    if (!NextCandidate(st, fitted)) break;
  }
  if (s.best < 0)
    return absl::DeadlineExceededError(absl::StrCat("no candidate fitted before the search ended: ", s.stopped));
  return s;
}

absl::Status Capacity(const Base& base, const SearchOptions& so, comm::Communicator& world) {
  const engine::EngineConfig& config = base.setup->engine;
  const std::vector<std::string> nvme = NvmePaths(config);
  uint64_t free_disk = 0;
  STRATA_ASSIGN_OR_RETURN(free_disk, FreeDiskBytes(nvme));  // 0 without NVMe; before any swap file exists
  CapacityResults results;
  if (world.rank() == 0) {
    STRATA_RETURN_IF_ERROR(results.Open(so.results));
    if (!so.results.empty()) std::printf("appending each finished candidate to %s\n", so.results.c_str());
  }
  STRATA_ASSIGN_OR_RETURN(const Search s, RunSearch(base, so, world, free_disk, results));
  if (world.rank() != 0) return absl::OkStatus();
  PrintTable(s.all);
  if (!s.stopped.empty()) std::printf("search stopped early: %s\n", s.stopped.c_str());
  const Attempt& best = s.all[static_cast<size_t>(s.best)];
  PrintLargest(best);
  PrintCapacityBound(config, free_disk, MeasureBytesPerParam(config, best.mem, best.params, world.size()), best.params,
                     world.size());
  if (nvme.empty() || best.last.nvme_read_bytes + best.last.nvme_write_bytes == 0) {
    std::printf("I/O floor: none (the step moves no NVMe bytes)\n");
    return absl::OkStatus();
  }
  return PrintIoFloor(nvme, so.probe_bytes, StepTiming{best.step_ms, best.last, world.size()});
}

// The search's own flags, taken out of `args`; the rest are strata train's.
absl::Status ParseSearchFlags(const std::vector<std::string>& args, SearchOptions* so, std::vector<std::string>* rest) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool ours = a == "--vary" || a == "--max-params" || a == "--time-limit" || a == "--results" ||
                      a == "--probe-bytes" || a == "--disk-reserve";
    if (!ours) {
      rest->push_back(a);
      continue;
    }
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
    const std::string& v = args[++i];
    double d = 0;
    if (a == "--vary") {
      if (v != "layers" && v != "width") return absl::InvalidArgumentError("--vary layers|width");
      so->width = v == "width";
    } else if (a == "--results") {
      so->results = v;
    } else if (a == "--probe-bytes") {
      STRATA_ASSIGN_OR_RETURN(so->probe_bytes, ParseBytes(v));
    } else if (a == "--disk-reserve") {
      STRATA_ASSIGN_OR_RETURN(so->disk_reserve, ParseBytes(v));
    } else if (!absl::SimpleAtod(v, &d) || !(d > 0) || d > 1e18) {
      return absl::InvalidArgumentError(absl::StrCat(a, " '", v, "' is not a positive number"));
    } else if (a == "--max-params") {
      so->max_params = static_cast<int64_t>(d);  // 3e9 is accepted
    } else {
      so->time_limit_s = d;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string BenchCapacityUsage() {
  return "usage: strata bench capacity [--vary layers|width] [--max-params N] [--time-limit S] [--results FILE]\n"
         "                             [--probe-bytes B] [--disk-reserve B] [strata train's flags]\n"
         "  finds the largest model (more layers, or a wider model) whose step trains within --device-budget and\n"
         "  --host-budget, with the offload flags given. Prints each candidate as it starts (size, estimated time)\n"
         "  and ends (fits or why not, step time, peak bytes per tier), then a table of all, the largest model,\n"
         "  the physical bound (free disk + host budget) / bytes per parameter, and with NVMe offload the step's\n"
         "  I/O floor (NVMe bytes per step over the path's bandwidth, measured by fio when installed). SIGINT or\n"
         "  SIGTERM stops it at once, keeping the finished candidates in --results. Flags:\n"
         "  --vary layers|width         what grows (default layers; the MLP, whose depth is fixed: width)\n"
         "  --max-params N              try no model larger than N parameters (3e9 is accepted)\n"
         "  --time-limit S              start no candidate estimated to end past S seconds; print what finished\n"
         "  --results FILE              append each finished candidate to FILE as one JSON line\n"
         "  --probe-bytes B             bytes the bandwidth probe writes then reads (default 64MiB)\n"
         "  --disk-reserve B            with NVMe offload the search starts at the largest model the engine's\n"
         "                              accounting predicts to fit the budgets and the free disk less B\n"
         "                              (default 2GiB), and tries nothing larger\n" +
         spec::TrainFlagsUsage();
}

int BenchCapacityCommand(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<spec::CommandLaunch> start = spec::StartLaunch("bench capacity", &code);  // MPI, then the launch
  if (!start.has_value()) return code;
  const comm::Launch* launch = &start->launch;
  // The search runs the host back-end (Note [Launchers]): MPI's world, or one torchrun rank.
  if (auto refused = spec::RefuseHostUnderTorchrun(*launch, device::DeviceKind::kHost, "bench capacity")) {
    if (launch->rank == 0) std::fprintf(stderr, "strata bench capacity: %s\n", refused->c_str());
    return 2;
  }
  SearchOptions so;
  std::vector<std::string> rest;
  absl::Status s = ParseSearchFlags(args, &so, &rest);
  Base base;
  if (s.ok()) {
    absl::StatusOr<const spec::Family*> family = spec::TakeFamily(&rest);  // --model-family, or the default
    absl::StatusOr<std::unique_ptr<spec::TrainSetup>> setup =
        family.ok() ? (*family)->ParseTrain(rest, launch->size) : family.status();
    s = setup.status();
    if (s.ok()) base = Base{*family, *std::move(setup)};
  }
  if (s.ok()) {
    SetMinLogSeverity(LogSeverity::kError);  // failed candidates are expected; their errors are not news
    auto world = start->mpi->World(comm::Options{});
    s = world.ok() ? Capacity(base, so, **world) : world.status();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench capacity: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
