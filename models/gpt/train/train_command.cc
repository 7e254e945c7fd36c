// `strata train`: the GPT-2 trainer on the engine, one process per rank under mpirun, srun or torchrun
// (Note [Launchers] in launch.cc).
#include <sys/resource.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt/data/data.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/train/command_start.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/model_flags.h"
#include "models/gpt/train/step_diagnostics.h"
#include "models/gpt/train/train_options.h"
#include "models/gpt/train/trainer.h"
#include "models/gpt/weights/weights.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/checkpoint/json_input.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/trace.h"
#include "runtime/optim/optimizer.h"
#include "tools/cli/commands.h"
#include "tools/launch.h"

namespace strata::tools {
namespace {

using engine::Engine;

// The signal that asked the job to stop (SIGINT / SIGTERM), 0 if none. A signal handler can only set a
// flag; this is the one piece of process-wide mutable state, read once per step.
std::atomic<int> g_stop_signal{0};
extern "C" void OnStopSignal(int sig) { g_stop_signal.store(sig); }

std::string TrainerState(const TrainOptions& o, int64_t next_step, int64_t global_batch) {
  nlohmann::ordered_json j;
  j["model_kind"] = "gpt2";
  j["model"] = {{"layers", o.model.layers}, {"d_model", o.model.d_model}, {"heads", o.model.heads},
                {"seq_len", o.model.seq_len}, {"vocab", o.model.vocab}};
  j["next_step"] = next_step;
  j["global_batch"] = global_batch;
  j["seed"] = o.engine.seed;
  j["data"] = o.data;
  j["data_order"] = o.order == gpt::DataOrder::kShuffled ? "shuffled" : "sequential";
  return j.dump();
}

// The trainer state of checkpoint `dir` (written by TrainerState), every field type-checked: the
// checkpoint may come from anywhere. next_step must be the step the directory is named for.
struct SavedTrainer {
  int64_t next_step = 0;
  std::optional<int64_t> global_batch;
  std::optional<uint64_t> seed;
};

absl::StatusOr<SavedTrainer> ParseTrainerState(const std::string& state, const std::string& dir) {
  const std::string where = absl::StrCat("checkpoint '", dir, "' trainer state");
  auto j = checkpoint::ParseUntrustedJson(state, where);
  if (!j.ok() || !j->is_object() || !j->contains("next_step")) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir, "' lacks the trainer state (next_step)"));
  }
  const checkpoint::JsonReader in(where);
  SavedTrainer t;
  STRATA_ASSIGN_OR_RETURN(t.next_step, in.Int(*j, "next_step", "trainer.next_step", 0, INT64_MAX));
  if (j->contains("global_batch")) {
    STRATA_ASSIGN_OR_RETURN(t.global_batch, in.Int(*j, "global_batch", "trainer.global_batch", 1, INT64_MAX));
  }
  if (j->contains("seed")) {
    STRATA_ASSIGN_OR_RETURN(t.seed, in.Uint(*j, "seed", "trainer.seed"));
  }
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::optional<int64_t> named = checkpoint::ParseStepDirName(p.filename().string());
  if (named.has_value() && *named != t.next_step) {
    return absl::DataLossError(absl::StrCat(where, ": field 'trainer.next_step' is ", t.next_step,
                                            " but the directory is named for step ", *named,
                                            " (a renamed or mixed-up checkpoint)"));
  }
  return t;
}

// Loads --resume and returns the step to continue from. The data position is the step: the sampler's
// order depends only on the seed and the global sample index.
absl::StatusOr<int64_t> Resume(const TrainOptions& o, Engine& e, int64_t global_batch) {
  STRATA_ASSIGN_OR_RETURN(std::string dir, checkpoint::ResolveCheckpoint(o.resume));
  STRATA_ASSIGN_OR_RETURN(std::string state, e.LoadCheckpoint(dir));
  STRATA_ASSIGN_OR_RETURN(SavedTrainer t, ParseTrainerState(state, dir));
  if (t.global_batch.value_or(global_batch) != global_batch || t.seed.value_or(o.engine.seed) != o.engine.seed) {
    STRATA_LOG(Warning) << "resuming with global batch " << global_batch << " and seed " << o.engine.seed
                        << " where the checkpoint used " << t.global_batch.value_or(0) << " and "
                        << t.seed.value_or(0) << ": the data order will differ from the original run";
  }
  if (t.next_step >= o.steps) {  // every rank read the same step: every rank refuses alike
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume: checkpoint '", dir, "' is at step ", t.next_step, " and --steps is ", o.steps,
        ", so there is nothing to train; --steps counts from the start of the run: pass more than ", t.next_step));
  }
  if (e.rank() == 0) std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(t.next_step));
  return t.next_step;
}

// Resuming with the same --metrics continues its file: the lines of the steps up to the checkpoint are kept
// (those after it, from the run that went on past the checkpoint, are replaced by this run's), written to a
// temporary and renamed over the file, then appended to. A file that is not there starts anew.
absl::Status KeepMetricsUpTo(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return absl::OkStatus();
  const std::string tmp = absl::StrCat(path, ".tmp");
  std::ofstream out(tmp, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write '", tmp, "' (the metrics file's temporary)"));
  std::string line;
  int64_t kept = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;  // a line cut short
    if (j["step"].get<int64_t>() > step) continue;
    out << line << "\n";
    ++kept;
  }
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("writing '", tmp, "' failed"));
  out.close();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::DataLossError(absl::StrCat("renaming '", tmp, "' to '", path, "': ", ec.message()));
  std::printf("metrics: kept the %lld lines of steps up to %lld in %s; appending\n", static_cast<long long>(kept),
              static_cast<long long>(step), path.c_str());
  return absl::OkStatus();
}

// Keeps the newest o.keep_last complete checkpoints; each older one loses its manifest first
// (checkpoint::RemoveStep), so an interrupted prune never leaves one that looks complete.
absl::Status SaveAndPrune(const TrainOptions& o, Engine& e, int64_t done, int64_t global_batch) {
  const std::string dir = (std::filesystem::path(o.checkpoint_dir) / checkpoint::StepDirName(done)).string();
  STRATA_RETURN_IF_ERROR(e.SaveCheckpoint(dir, TrainerState(o, done, global_batch)));
  if (e.rank() != 0) return absl::OkStatus();
  std::printf("checkpoint: %s\n", dir.c_str());
  if (o.keep_last > 0) {
    std::vector<std::string> steps = checkpoint::CompleteSteps(o.checkpoint_dir);
    for (size_t i = 0; i + o.keep_last < steps.size(); ++i) {
      if (absl::Status s = checkpoint::RemoveStep(steps[i]); !s.ok()) {
        STRATA_LOG(Warning) << "cannot remove old checkpoint " << steps[i] << ": " << s.message();
      }
    }
  }
  return absl::OkStatus();
}

struct StepLog {
  int64_t step;
  double loss, lr, tokens_per_s, step_ms, grad_norm, data_wait_ms;
  float loss_scale;
  bool skipped;
  const engine::StepResult* r;
};

// JSON has no NaN or Infinity: non-finite values are written as null.
// %.9g round-trips a float exactly, so equal trajectories print equal text.
std::string Num(double v) { return std::isfinite(v) ? absl::StrFormat("%.9g", v) : "null"; }

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
        "\"loss_scale\":%g,\"skipped\":%s,\"data_wait_ms\":%.3f,\"compute_ms\":%.3f,\"exposed_comm_ms\":%.3f,"
        "\"exposed_io_ms\":%.3f,\"optimizer_ms\":%.3f,\"nvme_read_bytes\":%d,\"nvme_write_bytes\":%d,"
        "\"peak_bytes\":%s}\n",
        l.step, Num(l.loss), l.lr, l.tokens_per_s, l.step_ms, Num(l.grad_norm), l.loss_scale, l.skipped ? "true" : "false",
        l.data_wait_ms, l.r->compute_ms, l.r->exposed_comm_ms, l.r->exposed_io_ms, l.r->optimizer_ms,
        l.r->nvme_read_bytes, l.r->nvme_write_bytes, PeakJson(mem));
    metrics->flush();
  }
}

// Output paths are checked before training, so a typo costs seconds, not a finished run.
absl::Status PrepareOutputs(const TrainOptions& o) {
  // Each output its own file (issue 33: --metrics X --trace X --save-weights X overwrote one another).
  const std::pair<const char*, const std::string*> outs[] = {
      {"--save-weights", &o.save_weights}, {"--metrics", &o.metrics}, {"--trace", &o.trace}};
  for (size_t i = 0; i < std::size(outs); ++i) {
    for (size_t j = i + 1; j < std::size(outs); ++j) {
      if (outs[i].second->empty() || outs[j].second->empty()) continue;
      std::error_code e1, e2;
      const auto a = std::filesystem::weakly_canonical(*outs[i].second, e1);
      const auto b = std::filesystem::weakly_canonical(*outs[j].second, e2);
      if (!e1 && !e2 && a == b) {
        return absl::InvalidArgumentError(absl::StrCat(outs[i].first, " and ", outs[j].first, " name the same file '",
                                                       *outs[i].second, "'; give each output its own"));
      }
    }
  }
  for (const std::string& path : {o.save_weights, o.metrics, o.trace}) {
    if (path.empty()) continue;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create the directory of '", path, "': ", ec.message()));
  }
  if (!o.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpoint_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create --checkpoint-dir '", o.checkpoint_dir, "': ", ec.message()));
    }
  }
  return absl::OkStatus();
}

// This process's CPU time (every thread), in seconds.
double ProcessCpuSeconds() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Note [Divergence]: the model has checked every token against the vocabulary, so a non-finite loss is
// divergence; say so with what the user can change (the learning rate of this step, the fp16 loss scale).
absl::Status Diverged(const TrainOptions& o, const Engine& e, int64_t step, const absl::Status& cause) {
  const double lr = optim::ScheduledLr(o.engine.scheduler, o.engine.optimizer.lr, e.step());
  const std::string scale =
      o.engine.param_dtype == DType::kF16 ? absl::StrCat(", fp16 loss scale ", e.loss_scale()) : std::string();
  return absl::InternalError(absl::StrCat("step ", step + 1, ": ", cause.message(), " (learning rate ", lr, scale,
                                          "); lower --lr, lengthen --warmup or set --grad-clip"));
}

// `world` carries the engine's collectives; `host` (host buffers) the trainer's own, and is `world`
// itself unless the world is NCCL (Note [Launchers]).
absl::Status Train(const TrainOptions& o, comm::Communicator& world, comm::Communicator& host, Compute& compute) {
  const int rank = world.rank(), n = world.size();
  if (rank == 0) STRATA_RETURN_IF_ERROR(PrepareOutputs(o));
  const int micro = o.engine.train_micro_batch_size_per_gpu;
  const int accum = o.engine.gradient_accumulation_steps;
  int64_t tokens_per_step_check = 0;
  int64_t global_batch = 0;  // sequences per step; micro and accum are ints, the product is checked
  if (__builtin_mul_overflow(int64_t{micro} * accum, int64_t{n}, &global_batch) ||
      __builtin_mul_overflow(global_batch, int64_t{o.model.seq_len}, &tokens_per_step_check)) {
    return absl::InvalidArgumentError(absl::StrCat("--micro-batch ", micro, " x --grad-accum ", accum, " x ", n,
                                                   " ranks x --seq-len ", o.model.seq_len, " overflows 64 bits"));
  }
  if (int64_t{micro} * o.model.seq_len > std::numeric_limits<int>::max()) {  // the kernels index tokens with an int
    return absl::InvalidArgumentError(absl::StrCat("--micro-batch ", micro, " x --seq-len ", o.model.seq_len,
                                                   " tokens exceeds 2147483647 per micro-batch"));
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, gpt::LoadTokens(o.data, o.model.vocab));
  STRATA_ASSIGN_OR_RETURN(gpt::Sampler sampler, gpt::Sampler::Create(static_cast<int64_t>(tokens.size()),
                                                                      o.model.seq_len, o.engine.seed, o.order));
  device::HostDevice dev;  // host streams for the trainer's own collectives (metrics)
  STRATA_ASSIGN_OR_RETURN(GptRun run, BringUp(o.engine, o.model, world, *compute.device, std::move(compute.nn)));
  std::unique_ptr<Engine>& e = run.engine;
  gpt::GptModel& model = run.model;
  if (!o.init_from.empty() && !o.resume.empty()) {
    return absl::InvalidArgumentError("--init-from and --resume exclude each other");
  }
  if (!o.init_from.empty()) STRATA_RETURN_IF_ERROR(gpt::LoadWeights(*e, model, o.init_from));
  int64_t first_step = 0;
  if (!o.resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(first_step, Resume(o, *e, global_batch));
  }
  if (rank == 0) {
    std::printf("strata train: %s (%lld params), %d ranks on %s, ZeRO stage %d, %s params, global batch %lld x %d "
                "tokens (micro %d x accum %d x ranks %d), %lld windows of data\n",
                gpt::Describe(o.model).c_str(), static_cast<long long>(gpt::NumParams(o.model)), n,
                compute.name.c_str(), o.engine.stage,
                std::string(DTypeName(o.engine.param_dtype)).c_str(), static_cast<long long>(global_batch),
                o.model.seq_len, micro, accum, n, static_cast<long long>(sampler.num_windows()));
  }
  std::ofstream metrics;
  if (rank == 0 && !o.metrics.empty()) {
    if (first_step > 0) STRATA_RETURN_IF_ERROR(KeepMetricsUpTo(o.metrics, first_step));
    metrics.open(o.metrics, first_step > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics) return absl::PermissionDeniedError(absl::StrCat("cannot write metrics file '", o.metrics, "'"));
  }
  gpt::Loader loader(&tokens, std::move(sampler), o.model.seq_len, global_batch, micro, accum, n, rank, first_step);
  loader.set_delay_us(o.loader_delay_us);
  STRATA_ASSIGN_OR_RETURN(auto metrics_stream, dev.CreateStream("metrics"));
  std::vector<std::string> unit_names;
  for (int u = 0; u < e->num_units(); ++u) unit_names.push_back(e->layout(u).name);
  engine::TraceRecorder trace(rank, unit_names);
  e->timeline().SetEnabled(!o.trace.empty());
  // Where the ranks run (host, affinity), so a diagnostic can tell oversubscribed cores from a slow link.
  const HostRecord here = ThisHost();
  std::vector<HostRecord> hosts(n);
  static_assert(sizeof(HostRecord) % sizeof(float) == 0, "gathered as plain 4-byte words");
  STRATA_RETURN_IF_ERROR(host.AllGather(&here, hosts.data(), sizeof(HostRecord) / sizeof(float), DType::kF32,
                                        *metrics_stream).Wait());
  DiagnosticThresholds thresholds;
  thresholds.window = std::max(1, o.diagnostics_window);
  StepDiagnostics diagnostics(thresholds, CrowdedHost(hosts));
  const auto run_start = std::chrono::steady_clock::now();
  double tokens_total = 0, last_loss = 0;
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  for (int64_t step = first_step; step < o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = ProcessCpuSeconds();
    const double wait0 = loader.wait_seconds();
    gpt::Batch b;  // the micro-batch in flight
    const absl::StatusOr<double> l =
        RunMicroBatches(run, accum, micro, o.checkpointing, [&](int a) -> absl::StatusOr<MicroBatchInput> {
          const int64_t wait_start = device::NowNs();
          b = loader.Next();
          if (!o.trace.empty()) trace.Add(device::Span{"data", "data_wait", -1, wait_start, device::NowNs()});
          const bool inject = step == o.inject_nonfinite_step && rank == o.inject_nonfinite_rank && a == 0;
          return MicroBatchInput{b.inputs.data(), b.targets.data(), inject ? NAN : e->loss_scale()};
        });
    if (!l.ok()) return gpt::IsDivergence(l.status()) ? Diverged(o, *e, step, l.status()) : l.status();
    const double loss = *l;
    STRATA_ASSIGN_OR_RETURN(engine::StepResult r, e->Step());
    // One small all-gather per step: every rank's loss, stop request and data wait. A rank that waits
    // for its batch makes the others wait in the next collective, so the data-wait diagnostic needs the
    // slowest rank's wait, and that wait is not exposed communication on the others.
    // And each rank's CPU share of the step (process CPU time over wall time): under 1, it was descheduled.
    const double wait_ms = (loader.wait_seconds() - wait0) * 1e3;
    const double busy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const float mine[4] = {static_cast<float>(loss), g_stop_signal.load() != 0 ? 1.0f : 0.0f,
                           static_cast<float>(wait_ms),
                           busy_s > 0 ? static_cast<float>((ProcessCpuSeconds() - cpu0) / busy_s) : -1.0f};
    std::vector<float> all(4 * n);
    STRATA_RETURN_IF_ERROR(host.AllGather(mine, all.data(), 4, DType::kF32, *metrics_stream).Wait());
    float mean_loss = 0, stop = 0, max_wait_ms = 0, min_cpu_share = 1e9f;
    for (int q = 0; q < n; ++q) {  // in rank order: the same sum on every rank and every run
      mean_loss += all[4 * q] / n;
      stop += all[4 * q + 1];
      max_wait_ms = std::max(max_wait_ms, all[4 * q + 2]);
      min_cpu_share = std::min(min_cpu_share, all[4 * q + 3]);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o.trace.empty()) {
      trace.AddAll(e->timeline().Take());
      trace.Memory(device::NowNs(), e->memory_stats());
    }
    if (o.diagnostics_window > 0 && rank == 0) {
      const double peers_data_ms = max_wait_ms - wait_ms;  // spent here waiting for another rank's batch
      const StepTimes times{secs * 1e3,     max_wait_ms,    std::max(0.0, r.exposed_comm_ms - peers_data_ms),
                            r.exposed_io_ms, r.compute_ms,   r.optimizer_ms,
                            min_cpu_share};
      for (const std::string& line : diagnostics.Observe(times)) STRATA_LOG(Warning) << line;
    }
    tokens_total += double(global_batch) * o.model.seq_len;
    last_loss = mean_loss;
    if (rank == 0) {
      const bool print = step % o.print_every == 0 || step + 1 == o.steps || r.skipped;
      Report(o, StepLog{step + 1, mean_loss, r.lr, double(global_batch) * o.model.seq_len / secs, secs * 1e3,
                        r.grad_norm, wait_ms, r.loss_scale, r.skipped, &r},
             e->memory_stats(), print, &metrics);
    }
    if (stop > 0) {
      return absl::CancelledError(absl::StrCat("stopped by signal after step ", step + 1,
                                               "; no checkpoint was started for it, none is left partial"));
    }
    const bool last = step + 1 == o.steps;
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || (last && o.checkpoint_every == 0))) {
      STRATA_RETURN_IF_ERROR(SaveAndPrune(o, *e, step + 1, global_batch));
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (!o.trace.empty()) {
    STRATA_RETURN_IF_ERROR(engine::WriteTrace(host, *metrics_stream, &trace, o.trace));
    if (rank == 0) std::printf("trace: %s (open in chrome://tracing or ui.perfetto.dev)\n", o.trace.c_str());
  }
  if (rank == 0) {
    const std::string summary = diagnostics.Summary();
    if (o.diagnostics_window > 0 && !summary.empty()) std::printf("%s\n", summary.c_str());
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

std::string TrainUsage() { return Flags::Usage("train", TrainFlagDefs()); }

int TrainCommand(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<CommandLaunch> start = StartLaunch("train", &code);
  if (!start.has_value()) return code;
  const Launch* launch = &start->launch;
  const int rank = launch->rank;
  const std::optional<TrainOptions> opts = OptionsForLaunch("train", *launch, args);
  if (!opts.has_value()) {
    // The peers may be valid and already inside the world's creation (no deadline there): end the job
    // rather than leave them waiting for this rank (issue 33: an MPMD launch with a bad flag hung).
    if (launch->size > 1) start->mpi->AbortJob(absl::StrCat("rank ", rank, ": invalid options (printed above)"));
    return 2;
  }
  comm::Options copts;
  copts.timeout_ms = opts->engine.collective_timeout_ms;
  auto job = StartJob(*start->mpi, *launch, *opts, copts);
  absl::Status s;
  try {  // the standard library's one exception, turned into a status at the command's boundary (as the C ABI does)
    s = job.ok() ? Train(*opts, *job->worlds.world, job->worlds.host_buffers(), job->compute) : job.status();
  } catch (const std::bad_alloc&) {  // issue 33: was an uncaught abort
    s = absl::ResourceExhaustedError(absl::StrCat(
        "out of host memory (std::bad_alloc) on rank ", rank, ": the model's activations grow with --micro-batch x "
        "--seq-len (here ", opts->engine.train_micro_batch_size_per_gpu, " x ", opts->model.seq_len, "); lower "
        "--micro-batch (raise --grad-accum to keep the global batch), or check the process's memory limit (ulimit -v)"));
  }
  if (absl::IsCancelled(s)) {  // a clean stop on SIGINT / SIGTERM: every rank agreed at a step boundary
    if (rank == 0) std::fprintf(stderr, "strata train: %s\n", std::string(s.message()).c_str());
    return 128 + g_stop_signal.load();
  }
  if (!s.ok()) {
    STRATA_LOG(Error) << "rank " << rank << " failed: " << s.message();
    // Let peers that detect the same collective error print theirs before the job is torn down. Under
    // MPI the abort ends the job; under torchrun it aborts this rank's NCCL world, and torchrun's agent
    // stops the other ranks when this one exits non-zero.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (job.ok() && launch->size > 1) job->worlds.world->Abort(s);
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
