// `strata train`: the GPT-2 trainer on the engine (host back-end), one process per rank under mpirun.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/data.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/weights.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "tools/commands.h"
#include "tools/model_flags.h"
#include "tools/train_options.h"

namespace strata::tools {
namespace {

using engine::Engine;

struct StepLog {
  int64_t step;
  double loss, lr, tokens_per_s, step_ms, grad_norm, data_wait_ms;
  float loss_scale;
  bool skipped;
};

// JSON has no NaN or Infinity: non-finite values are written as null.
std::string Num(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "null"; }

std::string PeakJson(const engine::MemoryStats& m) {
  std::string s = "{";
  for (int t = 0; t < memory::kNumTiers; ++t) {
    absl::StrAppend(&s, t ? "," : "", "\"", memory::TierName(static_cast<memory::Tier>(t)), "\":", m.tier[t].peak_bytes);
  }
  return s + "}";
}

std::string PeakText(const engine::MemoryStats& m) {
  std::string s;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    absl::StrAppend(&s, t ? "  " : "", memory::TierName(static_cast<memory::Tier>(t)), " ", FormatBytes(m.tier[t].peak_bytes));
  }
  return s;
}

void Report(const TrainOptions& o, const StepLog& l, const engine::MemoryStats& mem, bool print,
            std::ofstream* metrics) {
  if (print) {
    std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f tok/s | %7.1f ms | peak %s%s\n",
              static_cast<long long>(l.step), static_cast<long long>(o.steps), l.loss, l.lr, l.tokens_per_s, l.step_ms,
              PeakText(mem).c_str(), l.skipped ? " | SKIPPED (non-finite gradients)" : "");
    std::fflush(stdout);
  }
  if (metrics != nullptr && metrics->is_open()) {
    *metrics << absl::StrFormat(
        "{\"step\":%d,\"loss\":%s,\"lr\":%.6g,\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"grad_norm\":%s,"
        "\"loss_scale\":%g,\"skipped\":%s,\"data_wait_ms\":%.3f,\"peak_bytes\":%s}\n",
        l.step, Num(l.loss), l.lr, l.tokens_per_s, l.step_ms, Num(l.grad_norm), l.loss_scale, l.skipped ? "true" : "false",
        l.data_wait_ms, PeakJson(mem));
    metrics->flush();
  }
}

absl::Status Train(const TrainOptions& o, comm::Communicator& world) {
  const int rank = world.rank(), n = world.size();
  const int micro = static_cast<int>(o.engine.train_micro_batch_size_per_gpu);
  const int accum = o.engine.gradient_accumulation_steps;
  const int64_t global_batch = int64_t{micro} * accum * n;
  STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, gpt::LoadTokens(o.data, o.model.vocab));
  STRATA_ASSIGN_OR_RETURN(gpt::Sampler sampler, gpt::Sampler::Create(static_cast<int64_t>(tokens.size()),
                                                                      o.model.seq_len, o.engine.seed, o.order));
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(o.engine, world, dev));
  STRATA_ASSIGN_OR_RETURN(gpt::GptModel model, gpt::GptModel::Register(*e, o.model));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  if (!o.init_from.empty()) STRATA_RETURN_IF_ERROR(gpt::LoadWeights(*e, model, o.init_from));
  if (rank == 0) {
    std::printf("strata train: %s (%lld params), %d ranks, ZeRO stage %d, %s params, global batch %lld x %d tokens "
                "(micro %d x accum %d x ranks %d), %lld windows of data\n",
                gpt::Describe(o.model).c_str(), static_cast<long long>(gpt::NumParams(o.model)), n, o.engine.stage,
                std::string(DTypeName(o.engine.param_dtype)).c_str(), static_cast<long long>(global_batch),
                o.model.seq_len, micro, accum, n, static_cast<long long>(sampler.num_windows()));
  }
  std::ofstream metrics;
  if (rank == 0 && !o.metrics.empty()) {
    metrics.open(o.metrics);
    if (!metrics) return absl::PermissionDeniedError(absl::StrCat("cannot write metrics file '", o.metrics, "'"));
  }
  gpt::Loader loader(&tokens, std::move(sampler), o.model.seq_len, global_batch, micro, accum, n, rank, 0);
  loader.set_delay_us(o.loader_delay_us);
  STRATA_ASSIGN_OR_RETURN(auto metrics_stream, dev.CreateStream("metrics"));
  const auto run_start = std::chrono::steady_clock::now();
  double tokens_total = 0, last_loss = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double wait0 = loader.wait_seconds();
    double loss = 0;
    for (int a = 0; a < accum; ++a) {
      gpt::Batch b = loader.Next();
      const bool inject = step == o.inject_nonfinite_step && rank == o.inject_nonfinite_rank && a == 0;
      const float scale = inject ? NAN : e->loss_scale();
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      STRATA_ASSIGN_OR_RETURN(double l, model.TrainMicroBatch(*e, b.inputs.data(), b.targets.data(), micro, scale,
                                                              o.checkpointing));
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      loss += l / accum;
    }
    STRATA_ASSIGN_OR_RETURN(engine::StepResult r, e->Step());
    float mean_loss = static_cast<float>(loss);
    STRATA_RETURN_IF_ERROR(
        world.AllReduce(&mean_loss, &mean_loss, 1, DType::kF32, comm::ReduceOp::kAvg, *metrics_stream).Wait());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens_total += double(global_batch) * o.model.seq_len;
    last_loss = mean_loss;
    if (rank == 0) {
      const bool print = step % o.print_every == 0 || step + 1 == o.steps || r.skipped;
      Report(o, StepLog{step + 1, mean_loss, r.lr, double(global_batch) * o.model.seq_len / secs, secs * 1e3,
                        r.grad_norm, (loader.wait_seconds() - wait0) * 1e3, r.loss_scale, r.skipped},
             e->memory_stats(), print, &metrics);
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (rank == 0) {
    std::printf("done: %lld steps in %.1f s, final loss %.4f, %.0f tok/s on average, peak %s\n",
                static_cast<long long>(o.steps), total, last_loss, tokens_total / total,
                PeakText(e->memory_stats()).c_str());
  }
  if (!o.save_weights.empty()) {
    STRATA_RETURN_IF_ERROR(gpt::SaveWeights(*e, model, o.save_weights, rank == 0));
    if (rank == 0) std::printf("weights: %s\n", o.save_weights.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  int argc = 1;
  char arg0[] = "strata";
  char* argv0[] = {arg0, nullptr};
  char** argv = argv0;
  auto mpi = comm::MpiRuntime::Init(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "strata train: %s\n", std::string(mpi.status().message()).c_str());
    return 1;
  }
  const int rank = (*mpi)->world_rank();
  auto opts = ParseTrainOptions(args, (*mpi)->world_size());
  if (!opts.ok()) {
    if (rank == 0) std::fprintf(stderr, "strata train: %s\n", std::string(opts.status().message()).c_str());
    return 2;
  }
  comm::Options copts;
  copts.timeout_ms = opts->engine.collective_timeout_ms;
  auto world = (*mpi)->World(copts);
  absl::Status s = world.ok() ? Train(*opts, **world) : world.status();
  if (!s.ok()) {
    STRATA_LOG(Error) << "rank " << rank << " failed: " << s.message();
    // Let peers that detect the same collective error print theirs before the job is torn down.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (world.ok() && (*mpi)->world_size() > 1) (*world)->Abort(s);
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
