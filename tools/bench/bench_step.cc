// `strata bench step`: a model's training-step throughput (the GPT's by default; any model family's through
// spec/family.h), next to an sgemm rate measured in the same run (each rank times the model's own host
// product, ModelSpec::HostProduct: for the GPT a [B*T, C] x [C, 4C] product, the shape of the MLP's first
// matmul, at the same moment, so contention between ranks is in both numbers). Reports tokens/s, achieved
// GFLOP/s per rank (3 x forward FLOPs per token, 4 x with activation checkpointing) and its fraction of the
// sgemm rate.
// With --device cuda the reference is the GPU's dense bf16 matrix-product rate measured in the same run
// (the MFU denominator) instead.
// The optimizer update's time (StepResult::optimizer_ms: norm, clip, update, casts, without waits) is
// reported at one thread and at the configured strata.optimizer_threads: when that is more than one,
// --steps more pairs of steps alternate the two counts (so both see the same machine conditions) and
// the medians are reported, the slowest rank's (the step waits for it). The bits do not depend on it.
// The warm-up step checks the model's schedule (ModelSpec::Uses, which `strata plan` times) against the
// hooks its trainer called, as the engine's timeline recorded them (spec::CheckUses): a spec that differs
// fails the command naming the first use that differs.
// The collectives' split comes from the engine's timeline over the timed steps, rank 0's: the time each
// collective's stream spent in gathers, in gradient reduction (reduce-scatter or all-reduce) and, with
// hybrid sharding (--shard-group-size G), in the replica all-reduce of the reduced shards (overlapped
// with compute or not), beside the exposed communication (the trainer's thread waiting on them) and the
// payload each communicator issued per step (Note [Traffic]).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "spec/family.h"
#include "spec/launch.h"
#include "spec/registry.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Per step: stream time of each kind of collective, in ms, and what the engine's communicators issued.
struct CommSplit {
  double gather_ms = 0, reduce_ms = 0, replica_ms = 0, exposed_ms = 0;
  uint64_t gather_bytes = 0, reduce_bytes = 0, replica_bytes = 0;
};

CommSplit SplitOf(const std::vector<device::Span>& spans, const engine::CommTraffic& issued, double exposed_ms,
                  int steps) {
  CommSplit c;
  for (const device::Span& s : spans) {
    const double ms = 1e-6 * double(s.end_ns - s.start_ns);
    if (s.kind == "gather") c.gather_ms += ms;
    if (s.kind == "reduce_scatter" || s.kind == "all_reduce") c.reduce_ms += ms;
    if (s.kind == "replica_all_reduce") c.replica_ms += ms;
  }
  c.gather_ms /= steps, c.reduce_ms /= steps, c.replica_ms /= steps, c.exposed_ms = exposed_ms / steps;
  c.gather_bytes = issued.gather.total_bytes() / steps;
  c.reduce_bytes = issued.reduce.total_bytes() / steps;
  c.replica_bytes = issued.replica.total_bytes() / steps;
  return c;
}

std::string CommJson(const CommSplit& c, int group) {
  return absl::StrFormat(
      "\"shard_group_size\":%d,\"gather_ms\":%.3f,\"reduce_ms\":%.3f,\"replica_all_reduce_ms\":%.3f,"
      "\"exposed_comm_ms\":%.3f,\"gather_bytes\":%llu,\"reduce_bytes\":%llu,"
      "\"replica_bytes\":%llu",
      group, c.gather_ms, c.reduce_ms, c.replica_ms, c.exposed_ms, static_cast<unsigned long long>(c.gather_bytes),
      static_cast<unsigned long long>(c.reduce_bytes), static_cast<unsigned long long>(c.replica_bytes));
}

std::string CommText(const CommSplit& c, int group, int world) {
  return absl::StrFormat(
      "  collectives per step (stream time, rank 0): gather %.1f ms (%s), reduce %.1f ms (%s), "
      "replica all-reduce %.1f ms (%s); exposed %.1f ms; shard groups of %d (%d replicas)",
      c.gather_ms, FormatBytes(c.gather_bytes), c.reduce_ms, FormatBytes(c.reduce_bytes), c.replica_ms,
      FormatBytes(c.replica_bytes), c.exposed_ms, group, world / group);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median update time at 1 thread and at `threads`, over `pairs` steps of each, alternating; `step` runs
// one step and returns its StepResult::optimizer_ms. Leaves the engine at `threads`.
absl::StatusOr<std::pair<double, double>> UpdateMsAtOneAndN(engine::Engine& e, int threads, int pairs,
                                                            const std::function<absl::StatusOr<double>()>& step) {
  std::vector<double> one, many;
  for (int p = 0; p < pairs; ++p) {
    STRATA_RETURN_IF_ERROR(e.SetOptimizerThreads(1));
    STRATA_ASSIGN_OR_RETURN(const double a, step());
    STRATA_RETURN_IF_ERROR(e.SetOptimizerThreads(threads));
    STRATA_ASSIGN_OR_RETURN(const double b, step());
    one.push_back(a);
    many.push_back(b);
  }
  return std::make_pair(Median(one), Median(many));
}

// "," then each fact as a JSON member: ,"matmul":"bf16","attention":"fused".
std::string FactsJson(const spec::Facts& facts) {
  std::string s;
  for (const auto& [name, value] : facts) absl::StrAppend(&s, ",\"", name, "\":\"", value, "\"");
  return s;
}

// `world` carries the engine's collectives, `host` (host buffers) the bench's own (spec/launch.h).
absl::Status Bench(const spec::Family& family, const spec::TrainSetup& o, comm::Communicator& world,
                   comm::Communicator& host, spec::Compute& compute, bool json) {
  // On a GPU the reference is the dense bf16 matrix-product rate (MFU); on the host, sgemm (below).
  const bool gpu = compute.gpu();
  double bf16_flops = 0;
  if (gpu) {
    STRATA_ASSIGN_OR_RETURN(bf16_flops, compute.Bf16MatmulFlops());
  }
  device::HostDevice dev;  // a host stream for the bench's own collectives
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<spec::Trainer> run,
                          family.BringUp(*o.model, o.engine, world, compute.device(), &compute));
  engine::Engine* const e = &run->engine();
  const int B = o.engine.train_micro_batch_size_per_gpu, T = o.model->SequenceLength();
  run->SynthesizeTokens(1 + world.rank(), B);
  STRATA_ASSIGN_OR_RETURN(auto sync, dev.CreateStream("bench"));
  double fwd_bwd_s = 0, opt_s = 0;  // time in forward + backward, and in Step() (wait for reductions + update)
  double exposed_comm_ms = 0;       // StepResult::exposed_comm_ms, summed
  std::vector<double> update_ms;    // the update itself, per timed step (StepResult::optimizer_ms)
  auto run_step = [&]() -> absl::StatusOr<double> {
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(run->RunMicroBatches(o.engine.gradient_accumulation_steps, o.checkpointing).status());
    const auto t1 = Clock::now();
    STRATA_ASSIGN_OR_RETURN(const engine::StepResult r, e->Step());
    fwd_bwd_s += std::chrono::duration<double>(t1 - t0).count();
    opt_s += std::chrono::duration<double>(Clock::now() - t1).count();
    exposed_comm_ms += r.exposed_comm_ms;
    return r.optimizer_ms;
  };
  e->timeline().SetEnabled(true);
  STRATA_RETURN_IF_ERROR(run_step().status());  // warm-up: records the schedule, touches all memory
  e->timeline().SetEnabled(false);
  // The schedule `strata plan` times (ModelSpec::Uses) is the order the trainer called the hooks in.
  STRATA_RETURN_IF_ERROR(spec::CheckUses(*o.model, B, e->timeline().Take()));
  STRATA_RETURN_IF_ERROR(host.Barrier(*sync).Wait());
  const double sgemm = gpu ? 0.0 : o.model->HostProductGflops(o.model->HostProduct(B), 0.5);
  STRATA_RETURN_IF_ERROR(host.Barrier(*sync).Wait());
  if (o.steps > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("--steps ", o.steps, " is out of range [0, 2147483647]"));
  }
  const int steps = static_cast<int>(std::max<int64_t>(1, o.steps));
  fwd_bwd_s = opt_s = exposed_comm_ms = 0;
  e->timeline().SetEnabled(true);
  (void)e->timeline().Take();
  const engine::CommTraffic issued_before = e->comm_traffic();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    STRATA_ASSIGN_OR_RETURN(const double ms, run_step());
    update_ms.push_back(ms);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const engine::CommTraffic issued_after = e->comm_traffic();
  const engine::CommTraffic issued{issued_after.gather - issued_before.gather,
                                   issued_after.reduce - issued_before.reduce,
                                   issued_after.replica - issued_before.replica,
                                   {},
                                   {},
                                   {}};
  e->timeline().SetEnabled(false);
  const CommSplit comm_split = SplitOf(e->timeline().Take(), issued, exposed_comm_ms, steps);
  const int threads = e->optimizer_threads();
  std::pair<double, double> one_and_n{Median(update_ms), Median(update_ms)};
  if (threads > 1) {
    const double fb = fwd_bwd_s, op = opt_s;  // the figures above are the timed steps' alone
    STRATA_ASSIGN_OR_RETURN(one_and_n, UpdateMsAtOneAndN(*e, threads, steps, run_step));
    fwd_bwd_s = fb, opt_s = op;
  }
  // Ranks time their own shards; report the slowest rank (the step waits for it).
  float upd[2] = {static_cast<float>(one_and_n.first), static_cast<float>(one_and_n.second)};
  std::vector<float> all_upd(2 * size_t(world.size()));
  STRATA_RETURN_IF_ERROR(host.AllGather(upd, all_upd.data(), 2, DType::kF32, *sync).Wait());
  for (size_t r = 0; r < all_upd.size(); r += 2) {
    upd[0] = std::max(upd[0], all_upd[r]);
    upd[1] = std::max(upd[1], all_upd[r + 1]);
  }
  const double tokens = double(steps) * B * T * o.engine.gradient_accumulation_steps * world.size();
  const double flops_per_token = (o.checkpointing ? 4.0 : 3.0) * o.model->ForwardFlopsPerToken();
  const double gflops_per_rank = flops_per_token * tokens / secs / 1e9 / world.size();
  // Peak resident memory of the whole process (model state, activations, buffers), the largest over ranks.
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  float rss_mib = static_cast<float>(ru.ru_maxrss) / 1024.0f;  // ru_maxrss is in KiB on Linux
  std::vector<float> all_rss(world.size());
  STRATA_RETURN_IF_ERROR(host.AllGather(&rss_mib, all_rss.data(), 1, DType::kF32, *sync).Wait());
  const double max_rss_mib = *std::max_element(all_rss.begin(), all_rss.end());
  if (world.rank() != 0) return absl::OkStatus();
  const std::string shape = o.model->Describe();
  const std::string facts = FactsJson(run->facts());
  if (gpu) {  // MFU against the bf16 rate measured in this run (fp32 / TF32 products run below it)
    const double mfu = gflops_per_rank * 1e9 / bf16_flops;
    if (json) {
      std::printf(
          "{\"model\":\"%s\",\"params\":%lld,\"ranks\":%d,\"stage\":%d,\"micro_batch\":%d,\"seq_len\":%d,"
          "\"device\":\"%s\"%s,\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"gflops_"
          "per_rank\":%.2f,"
          "\"bf16_matmul_gflops\":%.1f,\"mfu\":%.4f,\"forward_backward_ms\":%.3f,\"step_call_ms\":%.3f,"
          "\"optimizer_threads\":%d,\"update_ms_1_thread\":%.3f,\"update_ms\":%.3f,"
          "\"peak_device_bytes\":%llu,%s}\n",
          shape.c_str(), static_cast<long long>(o.model->NumParams()), world.size(), o.engine.stage, B, T,
          compute.name().c_str(), facts.c_str(), secs / steps * 1e3, tokens / secs, gflops_per_rank, bf16_flops / 1e9,
          mfu, fwd_bwd_s / steps * 1e3, opt_s / steps * 1e3, threads, upd[0], upd[1],
          static_cast<unsigned long long>(e->memory_stats().tier[0].peak_bytes),
          CommJson(comm_split, e->shard_group_size()).c_str());
    } else {
      std::printf(
          "%s, %d ranks on %s, stage %d: %.1f ms/step, %.0f tokens/s, %.1f GFLOP/s per rank, MFU %.1f%% "
          "of the bf16 matmul rate (%.1f TFLOP/s in the same run); update %.2f ms on 1 thread, %.2f ms on %d\n",
          shape.c_str(), world.size(), compute.name().c_str(), o.engine.stage, secs / steps * 1e3, tokens / secs,
          gflops_per_rank, 100 * mfu, bf16_flops / 1e12, upd[0], upd[1], threads);
      std::printf("%s\n", CommText(comm_split, e->shard_group_size(), world.size()).c_str());
    }
    return absl::OkStatus();
  }
  if (json) {
    std::printf(
        "{\"model\":\"%s\",\"params\":%lld,\"ranks\":%d,\"stage\":%d,\"micro_batch\":%d,\"seq_len\":%d,"
        "\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"gflops_per_rank\":%.2f,\"sgemm_gflops_per_rank\":%.2f,"
        "\"fraction_of_sgemm\":%.3f,\"forward_backward_ms\":%.3f,\"step_call_ms\":%.3f,"
        "\"optimizer_threads\":%d,\"update_ms_1_thread\":%.3f,\"update_ms\":%.3f,"
        "\"peak_device_bytes\":%llu,\"max_rss_mib_per_rank\":%.1f,%s}\n",
        shape.c_str(), static_cast<long long>(o.model->NumParams()), world.size(), o.engine.stage, B, T,
        secs / steps * 1e3, tokens / secs, gflops_per_rank, sgemm, gflops_per_rank / sgemm, fwd_bwd_s / steps * 1e3,
        opt_s / steps * 1e3, threads, upd[0], upd[1],
        static_cast<unsigned long long>(e->memory_stats().tier[0].peak_bytes), max_rss_mib,
        CommJson(comm_split, e->shard_group_size()).c_str());
  } else {
    std::printf(
        "%s, %d ranks, stage %d: %.1f ms/step (forward+backward %.1f, Step() %.1f), %.0f tokens/s, "
        "%.2f GFLOP/s per rank = %.1f%% of sgemm (%.2f GFLOP/s per rank in the same run); "
        "update %.2f ms on 1 thread, %.2f ms on %d\n",
        shape.c_str(), world.size(), o.engine.stage, secs / steps * 1e3, fwd_bwd_s / steps * 1e3, opt_s / steps * 1e3,
        tokens / secs, gflops_per_rank, 100 * gflops_per_rank / sgemm, sgemm, upd[0], upd[1], threads);
    std::printf("%s\n", CommText(comm_split, e->shard_group_size(), world.size()).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

std::string BenchStepUsage() {
  return "usage: strata bench step [--json] [strata train's flags]\n"
         "  times --steps steps (default 3) of strata train's step and reports tokens/s, the step-time split\n"
         "  and the matmul rate against an sgemm measured in the same run, and the optimizer update's time on\n"
         "  one thread and on --optimizer-threads (medians of --steps more steps of each, alternating), and the\n"
         "  collectives' split: gather, gradient reduction and, with --shard-group-size G, the replica all-reduce\n"
         "  (stream time and bytes per step). Flags:\n"
         "  --json                      one JSON object\n" +
         spec::TrainFlagsUsage();
}

int BenchStepCommand(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<spec::CommandLaunch> start = spec::StartLaunch("bench step", &code);
  if (!start.has_value()) return code;
  std::vector<std::string> rest;
  bool json = false;
  for (const auto& a : args) (a == "--json" ? json = true : (rest.push_back(a), false));
  bool has_steps = false;
  for (const auto& a : rest) has_steps |= a.rfind("--steps", 0) == 0;
  if (!has_steps) rest.insert(rest.end(), {"--steps", "3"});
  const spec::Family* family = nullptr;  // --model-family, or the default
  const std::unique_ptr<spec::TrainSetup> opts = spec::SetupForLaunch("bench step", *start, rest, &family);
  if (opts == nullptr) return 2;
  auto job = spec::StartJob<std::unique_ptr<spec::Compute>>(
      *start->mpi, start->launch, opts->device_kind(), comm::Options{},
      [&](std::optional<int> local_rank) { return opts->MakeCompute(local_rank); });
  const absl::Status s =
      job.ok() ? Bench(*family, *opts, *job->worlds.world, job->worlds.host_buffers(), *job->compute, json)
               : job.status();
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench step: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
