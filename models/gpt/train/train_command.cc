// `strata train`: the GPT-2 trainer on the engine, one process per rank under mpirun, srun or torchrun
// (Note [Launchers] in runtime/comm/launcher.cc).
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt/data/data.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/train/command_start.h"
#include "models/gpt/train/commands.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/gpt_family.h"
#include "models/gpt/train/model_flags.h"
#include "models/gpt/train/run_files.h"
#include "models/gpt/train/step_diagnostics.h"
#include "models/gpt/train/train_options.h"
#include "models/gpt/train/trainer.h"
#include "models/gpt/weights/weights.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/checkpoint/json_input.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/trace.h"
#include "runtime/optim/optimizer.h"
#include "spec/launch.h"

namespace strata::tools {
namespace {

using engine::Engine;

// The signal that asked the job to stop (SIGINT / SIGTERM), 0 if none. A signal handler can only set a
// flag; this is the one piece of process-wide mutable state, read once per step.
std::atomic<int> g_stop_signal{0};
extern "C" void OnStopSignal(int sig) { g_stop_signal.store(sig); }

// What a run knows before it trains (Note [Run outputs], Note [A directory per run]): each rank's data,
// and the checkpoint it resumes from with the run that wrote it.
struct RunStart {
  std::vector<int32_t> tokens;
  std::string run_id;       // this run's identity: the resumed checkpoint's, or a new one
  bool legacy_ok = false;   // resumed from a checkpoint without an identity: such steps count as this run's
  std::string resume_dir;   // the step directory --resume resolved to
  TrainerState resumed;     // its trainer state
  int64_t first_step = 0;
};

// Each rank's checks before any model memory is allocated; the caller agrees on their outcome across the
// ranks, so one rank's missing data file or read-only directory stops every rank at once, each naming it.
absl::Status PrepareRun(const TrainOptions& o, int rank, RunStart* run) {
  STRATA_RETURN_IF_ERROR(CheckOutputs(o, rank));
  if (!o.init_from.empty() && !o.resume.empty()) {
    return absl::InvalidArgumentError("--init-from and --resume exclude each other");
  }
  STRATA_ASSIGN_OR_RETURN(run->tokens, gpt::LoadTokens(o.data, o.model.vocab));
  if (!o.init_from.empty() && ::access(o.init_from.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("--init-from '", o.init_from, "' cannot be read: ", std::strerror(errno)));
  }
  run->run_id = NewRunId();
  if (!o.resume.empty()) {
    STRATA_RETURN_IF_ERROR(CheckOneRun(o.resume));
    STRATA_ASSIGN_OR_RETURN(run->resumed, ReadTrainerState(o.resume, &run->resume_dir));
    run->first_step = run->resumed.next_step;
    if (run->first_step >= o.steps) {  // every rank read the same step: every rank refuses alike
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume: checkpoint '", run->resume_dir, "' is at step ", run->first_step, " and --steps is ", o.steps,
          ", so there is nothing to train; --steps counts from the start of the run: pass more than ",
          run->first_step));
    }
    if (!run->resumed.run_id.empty()) run->run_id = run->resumed.run_id;
    // Steps without an identity belong to the run that resumed one of them, and to its later resumes.
    run->legacy_ok = run->resumed.run_id.empty() || run->resumed.owns_legacy;
  }
  if (rank == 0 && !o.checkpoint_dir.empty()) {
    STRATA_RETURN_IF_ERROR(CheckCheckpointDir(o.checkpoint_dir, run->run_id, run->first_step, run->legacy_ok));
  }
  return absl::OkStatus();
}

// Note [One configuration] for the trainer: what every rank must share besides the engine's settings.
std::vector<std::pair<std::string, std::string>> TrainerFields(const TrainOptions& o, const RunStart& run) {
  return {
      {"model", gpt::Describe(o.model)},
      {"--data", absl::StrFormat("%zu tokens, fingerprint %016x", run.tokens.size(), TokensFingerprint(run.tokens))},
      {"--data-order", o.order == gpt::DataOrder::kShuffled ? "shuffled" : "sequential"},
      {"--steps", absl::StrCat(o.steps)},
      {"--resume",
       o.resume.empty() ? "none" : absl::StrCat("step ", run.first_step, " of run '", run.resumed.run_id, "'")},
      {"--init-from", o.init_from.empty() ? "none" : FileFingerprint(o.init_from)},
      {"--checkpoint-dir", o.checkpoint_dir.empty() ? "not given" : "given"},
      {"--checkpoint-every", absl::StrCat(o.checkpoint_every)},
      {"--checkpoint-async", o.checkpoint_async ? "on" : "off"},
      {"--device", o.device},
      {"--matmul", o.matmul ? absl::StrCat(static_cast<int>(*o.matmul)) : "default"},
      {"--attention", absl::StrCat(static_cast<int>(o.attention))}};
}

// Loads the checkpoint PrepareRun found; says what differs from the run that wrote it.
absl::Status Resume(const TrainOptions& o, Engine& e, const RunStart& run, int64_t global_batch, uint64_t data_fp) {
  STRATA_ASSIGN_OR_RETURN(std::string state, e.LoadCheckpoint(run.resume_dir));
  STRATA_ASSIGN_OR_RETURN(TrainerState t, ParseTrainerState(state, run.resume_dir));
  if (t.next_step != run.first_step) {
    return absl::DataLossError(absl::StrCat("checkpoint '", run.resume_dir, "' changed while it was being loaded"));
  }
  if (e.rank() != 0) return absl::OkStatus();
  const std::string order = o.order == gpt::DataOrder::kShuffled ? "shuffled" : "sequential";
  if (t.global_batch.value_or(global_batch) != global_batch || t.seed.value_or(o.engine.seed) != o.engine.seed) {
    STRATA_LOG(Warning) << "resuming with global batch " << global_batch << " and seed " << o.engine.seed
                        << " where the checkpoint used " << t.global_batch.value_or(0) << " and "
                        << t.seed.value_or(0) << ": the data order will differ from the original run";
  }
  if (t.data_order.value_or(order) != order) {
    STRATA_LOG(Warning) << "resuming with --data-order " << order << " where the checkpoint used " << *t.data_order
                        << ": the samples after step " << t.next_step << " differ from the original run's";
  }
  if (t.data_fingerprint.value_or(data_fp) != data_fp) {
    STRATA_LOG(Warning) << "resuming on other data than the checkpoint was trained on (--data '" << o.data
                        << "' has fingerprint " << absl::StrFormat("%016x", data_fp) << ", the checkpoint's data "
                        << absl::StrFormat("%016x", *t.data_fingerprint) << "): the run continues from step "
                        << t.next_step << " of the new data's order";
  }
  std::printf("resumed from %s at step %lld\n", run.resume_dir.c_str(), static_cast<long long>(t.next_step));
  return absl::OkStatus();
}

// Saves step `done`, then keeps the newest o.keep_last complete checkpoints of this run (Note [A directory
// per run]); each older one loses its manifest first (checkpoint::RemoveStep), so an interrupted prune never
// leaves one that looks complete.
//
// With --checkpoint-async (Note [Asynchronous checkpoints], runtime/checkpoint/async_save.h) the save returns
// once the state is copied to host memory; `*in_flight` names its directory until FinishAsyncSave waits for
// it (at the next save or after training), which is when it is reported and the older ones are pruned. The
// prune removes step directories without a manifest, so no rank may start the next save (and create its
// directory) before rank 0 pruned: the ranks agree after it (`host`, `stream`: the trainer's).
absl::Status FinishAsyncSave(const TrainOptions& o, Engine& e, const RunStart& run, std::string* in_flight,
                             comm::Communicator& host, device::Stream& stream) {
  if (in_flight->empty()) return absl::OkStatus();
  const std::string dir = std::exchange(*in_flight, std::string());
  STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
  if (e.rank() == 0) {
    std::printf("checkpoint: %s\n", dir.c_str());
    PruneCheckpoints(o.checkpoint_dir, run.run_id, run.legacy_ok, o.keep_last, dir);
  }
  return comm::AgreeOnOutcome(absl::OkStatus(), "pruning checkpoints", host, stream);
}

absl::Status SaveAndPrune(const TrainOptions& o, Engine& e, const RunStart& run, int64_t done, int64_t global_batch,
                          uint64_t data_fp, std::string* in_flight, comm::Communicator& host, device::Stream& stream) {
  const std::string dir = (std::filesystem::path(o.checkpoint_dir) / checkpoint::StepDirName(done)).string();
  TrainerState t;
  t.next_step = done;
  t.global_batch = global_batch;
  t.run_id = run.run_id;
  t.owns_legacy = run.legacy_ok;
  t.data_fingerprint = data_fp;
  if (o.checkpoint_async) {
    STRATA_RETURN_IF_ERROR(FinishAsyncSave(o, e, run, in_flight, host, stream));
    STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync(dir, TrainerStateJson(o, t)));
    *in_flight = dir;
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(e.SaveCheckpoint(dir, TrainerStateJson(o, t)));
  if (e.rank() != 0) return absl::OkStatus();
  std::printf("checkpoint: %s\n", dir.c_str());
  PruneCheckpoints(o.checkpoint_dir, run.run_id, run.legacy_ok, o.keep_last, dir);
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
    absl::StrAppend(&s, t ? "," : "", "\"", memory::TierName(static_cast<memory::Tier>(t)),
                    "\":", m.tier[t].peak_bytes);
  }
  return s + "}";
}

std::string PeakText(const engine::MemoryStats& m) {
  std::string s;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    absl::StrAppend(&s, t ? "  " : "", memory::TierName(static_cast<memory::Tier>(t)), " ",
                    FormatBytes(m.tier[t].peak_bytes));
  }
  return s;
}

absl::Status Report(const TrainOptions& o, const StepLog& l, const engine::MemoryStats& mem, bool print,
                    MetricsFile* metrics) {
  if (print) {
    std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f tok/s | %7.1f ms | peak %s%s\n",
              static_cast<long long>(l.step), static_cast<long long>(o.steps), l.loss, l.lr, l.tokens_per_s, l.step_ms,
              PeakText(mem).c_str(), l.skipped ? " | SKIPPED (non-finite gradients)" : "");
    std::fflush(stdout);
  }
  if (metrics == nullptr || !metrics->is_open()) return absl::OkStatus();
  return metrics->Append(absl::StrFormat(
      "{\"step\":%d,\"loss\":%s,\"lr\":%.6g,\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"grad_norm\":%s,"
      "\"loss_scale\":%g,\"skipped\":%s,\"data_wait_ms\":%.3f,\"compute_ms\":%.3f,\"exposed_comm_ms\":%.3f,"
      "\"exposed_io_ms\":%.3f,\"optimizer_ms\":%.3f,\"nvme_read_bytes\":%d,\"nvme_write_bytes\":%d,"
      "\"peak_bytes\":%s}\n",
      l.step, Num(l.loss), l.lr, l.tokens_per_s, l.step_ms, Num(l.grad_norm), l.loss_scale,
      l.skipped ? "true" : "false", l.data_wait_ms, l.r->compute_ms, l.r->exposed_comm_ms, l.r->exposed_io_ms,
      l.r->optimizer_ms, l.r->nvme_read_bytes, l.r->nvme_write_bytes, PeakJson(mem)));
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
  device::HostDevice dev;  // host streams for the trainer's own collectives (metrics)
  STRATA_ASSIGN_OR_RETURN(auto metrics_stream, dev.CreateStream("metrics"));
  RunStart start;
  STRATA_RETURN_IF_ERROR(comm::AgreeOnOutcome(PrepareRun(o, rank, &start), "before training", host, *metrics_stream));
  STRATA_RETURN_IF_ERROR(comm::AgreeOnFields(
      TrainerFields(o, start), "the trainer's configuration",
      "Every rank must be started with the same flags and data; only --metrics, --trace, --save-weights, "
      "--print-every, --diagnostics-window, the paths of --checkpoint-dir, --data and --init-from (their "
      "contents are compared), --keep-last, --activation-checkpointing, the collective timeout and memory "
      "budgets may differ per rank",
      host, *metrics_stream));
  if (!o.checkpoint_dir.empty()) STRATA_RETURN_IF_ERROR(CheckSharedDir(o.checkpoint_dir, host, *metrics_stream));
  const std::vector<int32_t>& tokens = start.tokens;
  const uint64_t data_fp = TokensFingerprint(tokens);
  const int64_t first_step = start.first_step;
  STRATA_ASSIGN_OR_RETURN(gpt::Sampler sampler, gpt::Sampler::Create(static_cast<int64_t>(tokens.size()),
                                                                      o.model.seq_len, o.engine.seed, o.order));
  STRATA_ASSIGN_OR_RETURN(GptRun run, BringUp(o.engine, o.model, world, *compute.device, std::move(compute.nn)));
  std::unique_ptr<Engine>& e = run.engine;
  gpt::GptModel& model = run.model;
  // From here a failure on this rank alone may leave its peers inside one of the engine's collectives: the
  // engine tells them (Note [Failure notices]), so they stop at once naming this rank, not at their timeout.
  const absl::Status s = [&]() -> absl::Status {
    if (!o.init_from.empty()) {  // a rank reads only its own byte ranges: a bad value may strike it alone
      STRATA_RETURN_IF_ERROR(
          comm::AgreeOnOutcome(gpt::LoadWeights(*e, model, o.init_from), "loading --init-from", host, *metrics_stream));
    }
    if (!o.resume.empty()) STRATA_RETURN_IF_ERROR(Resume(o, *e, start, global_batch, data_fp));
    if (rank == 0) {
      std::printf("strata train: %s (%lld params), %d ranks on %s, ZeRO stage %d, %s params, global batch %lld x %d "
                  "tokens (micro %d x accum %d x ranks %d), %lld windows of data\n",
                  gpt::Describe(o.model).c_str(), static_cast<long long>(gpt::NumParams(o.model)), n,
                  compute.name.c_str(), o.engine.stage,
                  std::string(DTypeName(o.engine.param_dtype)).c_str(), static_cast<long long>(global_batch),
                  o.model.seq_len, micro, accum, n, static_cast<long long>(sampler.num_windows()));
    }
    MetricsFile metrics;
    if (rank == 0 && !o.metrics.empty()) STRATA_RETURN_IF_ERROR(metrics.Open(o.metrics, first_step));
    gpt::Loader loader(&tokens, std::move(sampler), o.model.seq_len, global_batch, micro, accum, n, rank, first_step);
    loader.set_delay_us(o.loader_delay_us);
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
    std::string checkpoint_in_flight;  // --checkpoint-async: the directory being written
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
      // The stop request is the signal's number, and the job stops with the largest: every rank then exits
      // with the same status, 128 + that signal, whichever rank the signal reached (issue 33).
      const float mine[4] = {static_cast<float>(loss), static_cast<float>(g_stop_signal.load()),
                             static_cast<float>(wait_ms),
                             busy_s > 0 ? static_cast<float>((ProcessCpuSeconds() - cpu0) / busy_s) : -1.0f};
      std::vector<float> all(4 * n);
      STRATA_RETURN_IF_ERROR(host.AllGather(mine, all.data(), 4, DType::kF32, *metrics_stream).Wait());
      float mean_loss = 0, stop = 0, max_wait_ms = 0, min_cpu_share = 1e9f;
      for (int q = 0; q < n; ++q) {  // in rank order: the same sum on every rank and every run
        mean_loss += all[4 * q] / n;
        stop = std::max(stop, all[4 * q + 1]);
        max_wait_ms = std::max(max_wait_ms, all[4 * q + 2]);
        min_cpu_share = std::min(min_cpu_share, all[4 * q + 3]);
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!o.trace.empty()) {
        trace.AddAll(e->timeline().Take());
        trace.Memory(device::NowNs(), e->memory_stats());
      }
      // The run's first step is a warm-up (the loader's thread starts, pools are first touched): the diagnostics
      // judge the steps after it, or a loaded host starting the loader late reads as a data bottleneck.
      if (o.diagnostics_window > 0 && rank == 0 && step > first_step) {
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
        STRATA_RETURN_IF_ERROR(Report(o,
                                      StepLog{step + 1, mean_loss, r.lr, double(global_batch) * o.model.seq_len / secs,
                                              secs * 1e3, r.grad_norm, wait_ms, r.loss_scale, r.skipped, &r},
                                      e->memory_stats(), print, &metrics));
      }
      if (stop > 0) {
        g_stop_signal.store(static_cast<int>(stop));
        return absl::CancelledError(absl::StrCat("stopped by signal after step ", step + 1,
                                                 "; no checkpoint was started for it, none is left partial"));
      }
      const bool last = step + 1 == o.steps;
      if (!o.checkpoint_dir.empty() &&
          ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || (last && o.checkpoint_every == 0))) {
        STRATA_RETURN_IF_ERROR(
            SaveAndPrune(o, *e, start, step + 1, global_batch, data_fp, &checkpoint_in_flight, host, *metrics_stream));
      }
    }
    STRATA_RETURN_IF_ERROR(FinishAsyncSave(o, *e, start, &checkpoint_in_flight, host, *metrics_stream));
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    // The outputs after training: each is attempted whatever became of the one before (a trace on a full disk
    // must not cost the trained weights), the first error is the run's.
    absl::Status finish;
    if (!o.trace.empty()) {
      finish = engine::WriteTrace(host, *metrics_stream, &trace, o.trace);
      // A failed collective leaves the ranks out of step: nothing more can be exchanged.
      if (comm::IsPeerFailure(finish) || absl::IsDeadlineExceeded(finish)) return finish;
      if (finish.ok() && rank == 0)
        std::printf("trace: %s (open in chrome://tracing or ui.perfetto.dev)\n", o.trace.c_str());
    }
    if (rank == 0) {
      const std::string summary = diagnostics.Summary();
      if (o.diagnostics_window > 0 && !summary.empty()) std::printf("%s\n", summary.c_str());
      std::printf("done: %lld steps in %.1f s, final loss %.4f, %.0f tok/s on average, peak %s\n",
                  static_cast<long long>(o.steps), total, last_loss, tokens_total / total,
                  PeakText(e->memory_stats()).c_str());
    }
    // Then every rank waits for every other's outcome (Note [Agreed outcomes]): a rank that fails after
    // training (its trace, metrics or weights file) is named by every rank, none exits 0 beside it.
    if (absl::Status closed = metrics.Close(); finish.ok()) finish = closed;
    if (!o.save_weights.empty()) {
      absl::Status saved = Annotate(gpt::SaveWeights(*e, model, o.save_weights, rank == 0), "--save-weights");
      if (saved.ok() && rank == 0) std::printf("weights: %s\n", o.save_weights.c_str());
      if (finish.ok()) finish = saved;
    }
    return comm::AgreeOnOutcome(finish, "after training", host, *metrics_stream);
  }();
  if (!s.ok() && !absl::IsCancelled(s) && !comm::IsAgreedFailure(s)) e->NotifyFailure(s);
  return s;
}

}  // namespace

std::string TrainUsage() { return spec::Flags::Usage("train", TrainFlagDefs()); }

int TrainCommand(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<spec::CommandLaunch> start = spec::StartLaunch("train", &code);
  if (!start.has_value()) return code;
  const comm::Launch* launch = &start->launch;
  const int rank = launch->rank;
  const std::unique_ptr<spec::Family> own = gpt::MakeFamily();
  const spec::Family* family = own.get();
  const std::unique_ptr<spec::TrainSetup> setup = spec::SetupForLaunch("train", *start, args, &family);
  if (setup == nullptr) return 2;  // every rank, each having said why (Note [Start-up agreement])
  const TrainOptions* opts = gpt::OptionsOf(*setup);
  comm::Options copts;
  copts.timeout_ms = opts->engine.collective_timeout_ms;
  auto job = StartJob(*start->mpi, *launch, *opts, copts);
  absl::Status s;
  try {  // the standard library's one exception, turned into a status at the command's boundary (as the C ABI does)
    s = job.ok() ? Train(*opts, *job->worlds.world, job->worlds.host_buffers(), job->compute) : job.status();
  } catch (const std::bad_alloc&) {  // issue 33: was an uncaught abort
    s = absl::ResourceExhaustedError(absl::StrCat("out of host memory (std::bad_alloc) on rank ", rank,
                                                  ": the model's activations grow with --micro-batch x "
                                                  "--seq-len (here ",
                                                  opts->engine.train_micro_batch_size_per_gpu, " x ",
                                                  opts->model.seq_len,
                                                  "); lower "
                                                  "--micro-batch (raise --grad-accum to keep the global batch), or "
                                                  "check the process's memory limit (ulimit -v)"));
  }
  if (absl::IsCancelled(s)) {  // a clean stop on SIGINT / SIGTERM: every rank agreed at a step boundary
    if (rank == 0) std::fprintf(stderr, "strata train: %s\n", std::string(s.message()).c_str());
    return 128 + g_stop_signal.load();
  }
  if (!s.ok()) {
    STRATA_LOG(Error) << "rank " << rank << " failed: " << s.message();
    if (comm::IsAgreedFailure(s)) return 1;  // every rank stops alike, each having said why: no abort needed
    // Let peers that detect the same collective error print theirs before the job is torn down. Under
    // MPI the abort ends the job; under torchrun it aborts this rank's NCCL world, and torchrun's agent
    // stops the other ranks when this one exits non-zero.
    if (job.ok() && launch->size > 1) job->worlds.host_buffers().NotifyFailure(s);  // the trainer's own collectives
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (job.ok() && launch->size > 1) job->worlds.world->Abort(s);
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
