// `strata bench capacity --device-budget X --host-budget Y [--nvme-path P] [--vary layers|width]`: the
// largest GPT that completes 3 steps within the budgets. Layers at fixed width (or width at fixed depth)
// grow by doubling until a run fails, then a binary search between the last success and the first
// failure. A candidate that does not fit fails at Finalize, before any step, so the search is cheap.
// Prints, for the largest model: parameters, peak bytes per tier, step time and its split.
#include <chrono>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/train/command_start.h"
#include "models/gpt/train/train_options.h"
#include "models/gpt/train/trainer.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "tools/cli/commands.h"
#include "tools/launch.h"

namespace strata::tools {
namespace {

struct Attempt {
  bool fits = false;
  std::string why;
  int64_t params = 0;
  double step_ms = 0;
  engine::StepResult last;
  engine::MemoryStats mem;
};

absl::StatusOr<Attempt> Try(const TrainOptions& o, const gpt::GptConfig& model, comm::Communicator& world, int steps) {
  Attempt a;
  a.params = gpt::NumParams(model);
  device::HostDevice dev;
  absl::StatusOr<GptRun> run = BringUp(o.engine, model, world, dev);
  if (absl::IsResourceExhausted(run.status())) {  // Finalize found that it does not fit the budgets
    a.why = std::string(run.status().message());
    return a;
  }
  STRATA_RETURN_IF_ERROR(run.status());
  engine::Engine& e = *run->engine;
  const int B = o.engine.train_micro_batch_size_per_gpu;
  std::vector<int32_t> in(size_t(B) * model.seq_len);
  std::mt19937 rng(7);
  for (auto& t : in) t = static_cast<int32_t>(rng() % model.vocab);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {  // one micro-batch a step, whatever the accumulation
    STRATA_RETURN_IF_ERROR(RunMicroBatches(*run, 1, B, o.checkpointing, [&](int) -> absl::StatusOr<MicroBatchInput> {
                             return MicroBatchInput{in.data(), in.data(), e.loss_scale()};
                           }).status());
    STRATA_ASSIGN_OR_RETURN(a.last, e.Step());
  }
  a.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  a.fits = true;
  a.mem = e.memory_stats();
  return a;
}

gpt::GptConfig Scaled(gpt::GptConfig m, bool width, int64_t k) {
  if (width) {
    m.d_model = static_cast<int>(k * m.heads);  // keep the head count; width in multiples of it
  } else {
    m.layers = static_cast<int>(k);
  }
  return m;
}

absl::Status Capacity(const TrainOptions& o, comm::Communicator& world, bool width) {
  const gpt::GptConfig base = o.model;
  const int steps = 3;
  int64_t good = 0, bad = 0, k = width ? std::max(1, base.d_model / base.heads) : std::max(1, base.layers);
  Attempt best;
  while (bad == 0 || bad - good > 1) {  // doubling, then bisection
    if ((width ? k * base.heads : k) > (int64_t{1} << 30)) {  // Scaled narrows to int; gpt dimensions stop at 2^30
      return absl::InvalidArgumentError(absl::StrCat("the search passed ", width ? "d_model" : "layers",
                                                     " 2^30 without running out of memory: set --device-budget "
                                                     "or --host-budget"));
    }
    STRATA_ASSIGN_OR_RETURN(Attempt a, Try(o, Scaled(base, width, k), world, steps));
    if (a.fits) {
      good = k;
      best = a;
    } else {
      bad = k;
      if (good == 0 && k == 1) return absl::ResourceExhaustedError(absl::StrCat("not even the smallest model fits: ", a.why));
    }
    k = bad == 0 ? 2 * k : (good + bad) / 2;
    if (bad != 0 && k == good) break;
  }
  if (world.rank() != 0) return absl::OkStatus();
  const gpt::GptConfig m = Scaled(base, width, good);
  std::printf("largest model within the budgets: %s, %lld parameters\n", gpt::Describe(m).c_str(),
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
  return absl::OkStatus();
}

}  // namespace

std::string BenchCapacityUsage() {
  return "usage: strata bench capacity [--vary layers|width] [strata train's flags]\n"
         "  finds the largest GPT (more layers, or a wider model) whose step trains within --device-budget and\n"
         "  --host-budget, with the offload flags given. Flags:\n"
         "  --vary layers|width         what grows (default layers)\n" +
         TrainUsage().substr(TrainUsage().find('\n') + 1);
}

int BenchCapacityCommand(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<CommandLaunch> start = StartLaunch("bench capacity", &code);  // MPI, then the launch
  if (!start.has_value()) return code;
  const Launch* launch = &start->launch;
  std::vector<std::string> rest;
  std::string vary = "layers";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--vary" && i + 1 < args.size()) {
      vary = args[++i];
    } else {
      rest.push_back(args[i]);
    }
  }
  // The search runs the host back-end (Note [Launchers]): MPI's world, or one torchrun rank.
  if (auto refused = RefuseHostUnderTorchrun(*launch, device::DeviceKind::kHost, "bench capacity")) {
    if (launch->rank == 0) std::fprintf(stderr, "strata bench capacity: %s\n", refused->c_str());
    return 2;
  }
  auto opts = ParseTrainOptions(rest, launch->size);
  absl::Status s = opts.status();
  if (s.ok() && vary != "layers" && vary != "width") s = absl::InvalidArgumentError("--vary layers|width");
  if (s.ok()) {
    SetMinLogSeverity(LogSeverity::kError);  // failed candidates are expected; their errors are not news
    auto world = start->mpi->World(comm::Options{});
    s = world.ok() ? Capacity(*opts, **world, vary == "width") : world.status();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench capacity: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
