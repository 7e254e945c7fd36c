// mlp_train: trains the example MLP through the engine under mpirun (or alone), on the host back-end; the
// runtime's launcher (runtime/comm/launcher.h) picks the world, and refuses a multi-rank torchrun launch.
//
//   mpirun -n 4 build/bin/mlp_train --stage 3 --steps 30 --seed 1
//
// Prints the loss of every step on rank 0. --dump writes the consolidated fp32 parameters (rank 0) and
// --compare checks them against such a dump, which is how the equivalence tests run. The --inject-*
// flags exist for the failure tests: they make one rank misbehave in a named way.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/input_file.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/launcher.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine.h"

namespace strata::mlp {
namespace {

struct Args {
  int64_t steps = 30;
  int64_t global_batch = 16;
  std::string config_path;
  std::vector<std::string> overrides;  // "key.path=value"
  std::string dump, compare;
  double rtol = 1e-5;
  int inject_mismatch_rank = -1;  // this rank registers a different unit shape
  int inject_stall_rank = -1;     // this rank stops before the forward of step 2
  bool print_memory = false;
  int64_t compute_delay_us = 0;
};

const char kUsage[] =
    "usage: mlp_train [--stage S] [--steps K] [--seed X] [--global-batch B] [--grad-accum A] [--lr LR]\n"
    "                 [--clip C] [--optimizer adamw|sgd] [--param-dtype fp32|bf16] [--max-live-units N]\n"
    "                 [--prefetch D] [--timeout-ms T] [--config FILE] [--set key.path=value]...\n"
    "                 [--dump FILE] [--compare FILE] [--rtol R] [--print-memory]\n";

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  static const std::pair<const char*, const char*> kOverrideFlags[] = {
      {"--stage", "zero_optimization.stage"}, {"--seed", "strata.seed"},
      {"--grad-accum", "gradient_accumulation_steps"}, {"--lr", "optimizer.params.lr"},
      {"--clip", "gradient_clipping"}, {"--optimizer", "optimizer.type"},
      {"--param-dtype", "strata.param_dtype"}, {"--max-live-units", "strata.max_live_units"},
      {"--prefetch", "strata.prefetch_depth"}, {"--timeout-ms", "strata.collective_timeout_ms"},
      {"--weight-decay", "optimizer.params.weight_decay"}, {"--momentum", "optimizer.params.momentum"}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return absl::InvalidArgumentError(kUsage);
    if (flag == "--print-memory") { a.print_memory = true; continue; }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("flag ", flag, " needs a value\n", kUsage));
    const std::string v = argv[++i];
    bool known = false;
    for (const auto& [name, key] : kOverrideFlags) {
      if (flag == name) {
        a.overrides.push_back(absl::StrCat(key, "=", v));
        known = true;
      }
    }
    if (known) continue;
    auto as_int = [&](int64_t* out) {
      return absl::SimpleAtoi(v, out)
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat(flag, " needs an integer, got '", v, "'"));
    };
    auto as_rank = [&](int* out) {  // a rank id: never narrowed silently
      int64_t n = 0;
      STRATA_RETURN_IF_ERROR(as_int(&n));
      if (n < 0 || n > std::numeric_limits<int>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", n, " is out of range [0, ",
                                                       std::numeric_limits<int>::max(), "]"));
      }
      *out = static_cast<int>(n);
      return absl::OkStatus();
    };
    if (flag == "--steps") { STRATA_RETURN_IF_ERROR(as_int(&a.steps)); }
    else if (flag == "--global-batch") { STRATA_RETURN_IF_ERROR(as_int(&a.global_batch)); }
    else if (flag == "--config") { a.config_path = v; }
    else if (flag == "--set") { a.overrides.push_back(v); }
    else if (flag == "--dump") { a.dump = v; }
    else if (flag == "--compare") { a.compare = v;
    } else if (flag == "--rtol") {
      if (!absl::SimpleAtod(v, &a.rtol)) return absl::InvalidArgumentError("--rtol needs a number");
    } else if (flag == "--inject-mismatch-rank") {
      STRATA_RETURN_IF_ERROR(as_rank(&a.inject_mismatch_rank));
    } else if (flag == "--inject-stall-rank") {
      STRATA_RETURN_IF_ERROR(as_rank(&a.inject_stall_rank));
    } else if (flag == "--compute-delay-us") {
      STRATA_RETURN_IF_ERROR(as_int(&a.compute_delay_us));
    } else
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag, "\n", kUsage));
  }
  return a;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  auto text = ReadConfigFile(path);
  if (!text.ok()) return Annotate(text.status(), "--config");
  return text;
}

absl::Status Compare(const std::vector<float>& got, const std::string& path, double rtol) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open reference dump '", path, "'"));
  std::vector<float> want(got.size());
  f.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
  if (f.gcount() != static_cast<std::streamsize>(want.size() * 4) || f.peek() != EOF) {
    return absl::DataLossError(absl::StrCat("reference '", path, "' does not hold ", got.size(), " floats"));
  }
  // |got - want| <= rtol * max(|want|, rms(want)): elements far below the typical parameter size are
  // judged on the parameters' scale, since summation-order rounding is absolute, not relative.
  double sq = 0;
  for (float w : want) sq += double(w) * w;
  const double rms = got.empty() ? 1.0 : std::sqrt(sq / want.size());
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rel = std::fabs(double(got[i]) - want[i]) / std::max(std::fabs(double(want[i])), rms);
    if (!(rel <= worst)) { worst = rel; worst_i = i; }
  }
  std::printf("compare: %zu params, max relative difference %.3g at index %zu (got %.9g, want %.9g), rtol %.1g\n",
              got.size(), worst, worst_i, got[worst_i], want[worst_i], rtol);
  if (!(worst <= rtol)) return absl::InternalError(absl::StrCat("parameters differ from '", path, "' beyond rtol"));
  return absl::OkStatus();
}

void PrintMemory(engine::Engine& e) {
  const engine::MemoryStats s = e.memory_stats();
  std::string line = absl::StrCat("{\"rank\":", e.rank(), ",\"world\":", e.world_size());
  for (int k = 0; k < memory::kNumKinds; ++k) {
    absl::StrAppend(&line, ",\"", memory::KindName(static_cast<memory::Kind>(k)), "_peak\":", s.kind[0][k].peak_bytes);
  }
  size_t params = 0, padded = 0, largest = 0;
  for (int u = 0; u < e.num_units(); ++u) {
    params += e.layout(u).used_elems;
    padded += e.layout(u).total_elems;
    largest = std::max(largest, e.layout(u).total_elems);
  }
  absl::StrAppend(&line, ",\"device_peak\":", s.tier[0].peak_bytes, ",\"params\":", params,
                  ",\"padded_elems\":", padded, ",\"largest_unit_elems\":", largest, "}");
  std::printf("memory: %s\n", line.c_str());
}

absl::Status Train(const Args& a, comm::Communicator& world, device::HostDevice& dev) {
  // Without --config, stage 3 as --stage documents; a config file's absent keys have DeepSpeed's defaults.
  std::string text = R"({"zero_optimization": {"stage": 3}})";
  if (!a.config_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(text, ReadFile(a.config_path));
  }
  STRATA_ASSIGN_OR_RETURN(engine::EngineConfig cfg, engine::ParseConfigWithOverrides(text, a.overrides));
  const int n = world.size(), accum = cfg.gradient_accumulation_steps;
  if (a.global_batch % (int64_t{n} * accum) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch ", a.global_batch, " is not a multiple of world size ", n, " x gradient accumulation ", accum));
  }
  const int64_t ranks_x_accum = int64_t{n} * accum;  // both ints: no overflow in 64 bits
  if (a.global_batch < 1 || a.global_batch / ranks_x_accum > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("--global-batch ", a.global_batch,
                                                   " is out of range [1, world size x gradient accumulation x ",
                                                   std::numeric_limits<int>::max(), "]"));
  }
  const int micro = static_cast<int>(a.global_batch / ranks_x_accum);
  STRATA_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(cfg, world, dev));
  STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*engine, MlpShape{}, world.rank() == a.inject_mismatch_rank));
  STRATA_RETURN_IF_ERROR(engine->Finalize());
  STRATA_ASSIGN_OR_RETURN(auto loss_stream, dev.CreateStream("loss"));
  for (int64_t step = 0; step < a.steps; ++step) {
    if (step == 1 && world.rank() == a.inject_stall_rank) {
      STRATA_LOG(Warning) << "--inject-stall-rank: this rank stops responding now";
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    double loss = 0;
    for (int mb = 0; mb < accum; ++mb) {
      // Global sample order: step, then micro-batch, then rank; any world size sees the same global batch.
      const int64_t first = step * a.global_batch + (int64_t{mb} * n + world.rank()) * micro;
      STRATA_RETURN_IF_ERROR(engine->BeginMicroBatch());
      STRATA_ASSIGN_OR_RETURN(double l, mlp.TrainMicroBatch(*engine, first, micro, a.compute_delay_us));
      STRATA_RETURN_IF_ERROR(engine->EndMicroBatch());
      loss += l / accum;
    }
    STRATA_ASSIGN_OR_RETURN(engine::StepResult r, engine->Step());
    float mean_loss = static_cast<float>(loss);
    STRATA_RETURN_IF_ERROR(
        world.AllReduce(&mean_loss, &mean_loss, 1, DType::kF32, comm::ReduceOp::kAvg, *loss_stream).Wait());
    if (world.rank() == 0) {
      std::printf("step %3lld  loss %.6f  grad_norm %.4f  lr %.3g%s\n", static_cast<long long>(r.step), mean_loss,
                  r.grad_norm, r.lr, r.skipped ? "  (skipped)" : "");
    }
  }
  if (a.print_memory) PrintMemory(*engine);
  if (!a.dump.empty() || !a.compare.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::vector<float> all, engine->GatherAllParams());
    if (world.rank() == 0 && !a.dump.empty()) {
      std::ofstream f(a.dump, std::ios::binary);
      f.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
      if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write dump '", a.dump, "'"));
    }
    if (world.rank() == 0 && !a.compare.empty()) STRATA_RETURN_IF_ERROR(Compare(all, a.compare, a.rtol));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace strata::mlp

int main(int argc, char** argv) {
  using namespace strata;
  auto mpi = comm::MpiRuntime::Init(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "mlp_train: %s\n", std::string(mpi.status().message()).c_str());
    return 1;
  }
  auto args = mlp::ParseArgs(argc, argv);
  if (!args.ok()) {
    if ((*mpi)->world_rank() == 0) std::fprintf(stderr, "%s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  auto launch = comm::DetectLaunch(**mpi);
  if (!launch.ok()) {
    std::fprintf(stderr, "mlp_train: %s\n", std::string(launch.status().message()).c_str());
    return 2;
  }
  if (auto refused = comm::RefuseHostTorchrun(*launch, device::DeviceKind::kHost, "mlp_train")) {
    if (launch->rank == 0) std::fprintf(stderr, "mlp_train: %s\n", refused->c_str());
    return 2;
  }
  comm::Options opts;
  opts.timeout_ms = 60000;
  device::HostDevice dev;
  auto worlds = comm::StartWorlds(**mpi, *launch, device::DeviceKind::kHost, opts, [] { return absl::OkStatus(); });
  absl::Status s = worlds.ok() ? mlp::Train(*args, *worlds->world, dev) : worlds.status();
  if (!s.ok()) {
    STRATA_LOG(Error) << "rank " << (*mpi)->world_rank() << " failed: " << s.message();
    // Let peers that detect the same collective error print theirs before the job is torn down.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (worlds.ok()) worlds->world->Abort(s);
    return 1;
  }
  return 0;
}
