// The training stall of a checkpoint save, synchronous against asynchronous (Note [Asynchronous
// checkpoints], runtime/checkpoint/async_save.h), of the same state in one run, and the asynchronous save's
// bytes per second from its start to its publication. benchmarks/checkpoint_bench.sh puts fio's rate for the
// same bytes on the same directory beside it (docs/perf-notes.md "Asynchronous checkpoints").
//
//   strata_checkpoint_bench --dir DIR [--hidden 4096] [--world 1] [--rounds 3] [--threads 0] [--nvme DIR]
//
// --nvme: the optimizer state on NVMe under DIR (offload_optimizer = nvme), which the asynchronous save
// snapshots without a host copy (Note [Snapshots of NVMe state], optim/nvme_state.h). Each round then also
// prints the host memory the save held: the snapshot's host bytes and staging (Engine::
// checkpoint_snapshot_bytes) and the growth of the process's resident set from before the call to the most
// it reached while the save was in flight (sampled after the call and after every step).
//
// Each round ends with a third save of the same state, asynchronous with no step meanwhile, timed from the call
// to its publication (polled every millisecond): the writer's own rate ("async_alone_MBps"), beside fio's.
//
// --threads: the optimizer's threads (strata.optimizer_threads; 0: every CPU). With OMP_NUM_THREADS=1 and
// --threads 1 the training keeps to one core and the writer has the others, as beside a GPU's training.
//
// Per round: a synchronous save (its stall is its whole duration), then an asynchronous one (its stall is the
// call, plus what the steps taken while it is written lose against the median of the 4 steps before it,
// signed, so that the steps' own noise cancels; the spread of those 4 is printed as that noise), then
// WaitCheckpoint.
// Prints one "result" line per round and a JSON line of the medians.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

uint64_t DirBytes(const std::filesystem::path& d) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

struct Round {
  double sync_s, async_call_s, async_steps_extra_s, async_total_s, step_s, step_spread_s;
  uint64_t bytes;
  uint64_t snapshot_host, snapshot_nvme, snapshot_staging, rss_growth;
  double async_alone_s;            // an asynchronous save of the same state with no step meanwhile: call to published
  double sync_cpu_s, alone_cpu_s;  // the process's CPU time (user + system) over the sync save, the alone one
};

// This process's CPU time so far, user and system, every thread (Note [Direct checkpoint writes]: the copies
// into the page cache are system time of the writing thread).
double ProcessCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// This process's resident set (VmRSS), in bytes; 0 where /proc does not tell.
uint64_t RssBytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb * 1024;
}

absl::Status Run(int rank, int world, strata::comm::Communicator& c, const std::string& dir, int hidden, int rounds,
                 int optimizer_threads, const std::string& nvme, std::vector<Round>* out) {
  using strata::engine::Engine;
  strata::device::HostDevice dev;
  strata::engine::EngineConfig cfg;
  cfg.stage = world > 1 ? 3 : 0;
  cfg.optimizer_threads = optimizer_threads;
  if (!nvme.empty()) {
    cfg.offload_optimizer.device = strata::engine::OffloadDevice::kNvme;
    cfg.offload_optimizer.nvme_path = nvme;
    cfg.offload_optimizer.pin_memory = false;
  }
  STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
  STRATA_ASSIGN_OR_RETURN(auto mlp, strata::mlp::Mlp::Register(*e, strata::mlp::MlpShape{64, hidden, 16}));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  const int micro = 8;
  int64_t sample = 0;
  auto step = [&]() -> absl::StatusOr<double> {
    const Clock::time_point t = Clock::now();
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, sample + rank * micro, micro).status());
    sample += int64_t{world} * micro;
    STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    STRATA_RETURN_IF_ERROR(e->Step().status());
    return Since(t);
  };
  for (int r = 0; r < rounds; ++r) {
    Round round{};
    std::vector<double> before;
    for (int i = 0; i < 4; ++i) {
      STRATA_ASSIGN_OR_RETURN(double s, step());
      before.push_back(s);
    }
    round.step_s = Median(before);
    round.step_spread_s =
        *std::max_element(before.begin(), before.end()) - *std::min_element(before.begin(), before.end());
    const std::string sync_dir = absl::StrCat(dir, "/sync_", r), async_dir = absl::StrCat(dir, "/async_", r);
    double cpu = ProcessCpuSeconds();
    Clock::time_point t = Clock::now();
    STRATA_RETURN_IF_ERROR(e->SaveCheckpoint(sync_dir, "{}"));
    round.sync_s = Since(t);
    round.sync_cpu_s = ProcessCpuSeconds() - cpu;
    // The same state, saved asynchronously: no step in between.
    const uint64_t rss_before = RssBytes();
    t = Clock::now();
    STRATA_RETURN_IF_ERROR(e->SaveCheckpointAsync(async_dir, "{}"));
    round.async_call_s = Since(t);
    uint64_t rss_max = RssBytes();
    const Engine::SnapshotBytes held = e->checkpoint_snapshot_bytes();
    round.snapshot_host = held.host;
    round.snapshot_nvme = held.nvme;
    round.snapshot_staging = held.staging;
    int steps = 0;
    while (e->checkpoint_in_flight() || steps == 0) {
      STRATA_ASSIGN_OR_RETURN(double s, step());
      round.async_steps_extra_s += s - round.step_s;  // signed: the steps' noise cancels
      rss_max = std::max(rss_max, RssBytes());
      ++steps;
    }
    round.rss_growth = rss_max > rss_before ? rss_max - rss_before : 0;
    STRATA_RETURN_IF_ERROR(e->WaitCheckpoint());
    round.async_total_s = Since(t);
    // The writer alone: the same state again, no step while it is written (polled every millisecond).
    const std::string alone_dir = async_dir + "_alone";
    cpu = ProcessCpuSeconds();
    t = Clock::now();
    STRATA_RETURN_IF_ERROR(e->SaveCheckpointAsync(alone_dir, "{}"));
    while (e->checkpoint_in_flight()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    round.async_alone_s = Since(t);
    round.alone_cpu_s = ProcessCpuSeconds() - cpu;
    STRATA_RETURN_IF_ERROR(e->WaitCheckpoint());
    std::filesystem::remove_all(alone_dir);
    if (rank == 0) {
      round.bytes = DirBytes(async_dir);
      std::printf(
          "result round %d: step %.3f s (spread of 4: %.3f s); sync save %.3f s; async call %.3f s + %.3f s "
          "lost by %d steps while writing; async published after %.3f s; %.1f MB; snapshot host %.1f MB, "
          "NVMe held %.1f MB, staging %.3f MB; resident set grew %.1f MB; written alone in %.3f s; CPU s of the "
          "sync save %.3f, of the one alone %.3f\n",
          r, round.step_s, round.step_spread_s, round.sync_s, round.async_call_s, round.async_steps_extra_s, steps,
          round.async_total_s, round.bytes / 1e6, round.snapshot_host / 1e6, round.snapshot_nvme / 1e6,
          round.snapshot_staging / 1e6, round.rss_growth / 1e6, round.async_alone_s, round.sync_cpu_s,
          round.alone_cpu_s);
      std::fflush(stdout);
      out->push_back(round);
    }
    std::filesystem::remove_all(sync_dir);
    std::filesystem::remove_all(async_dir);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, nvme;
  int hidden = 4096, world = 1, rounds = 3, optimizer_threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    bool ok = true;
    if (k == "--dir")
      dir = v;
    else if (k == "--hidden")
      ok = absl::SimpleAtoi(v, &hidden);
    else if (k == "--world")
      ok = absl::SimpleAtoi(v, &world);
    else if (k == "--rounds")
      ok = absl::SimpleAtoi(v, &rounds);
    else if (k == "--threads")
      ok = absl::SimpleAtoi(v, &optimizer_threads);
    else if (k == "--nvme")
      nvme = v;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  if (dir.empty() || hidden < 1 || world < 1 || rounds < 1 || optimizer_threads < 0 || optimizer_threads > 256) {
    std::fprintf(stderr,
                 "usage: strata_checkpoint_bench --dir DIR [--hidden N] [--world N] [--rounds N] [--threads N] "
                 "[--nvme DIR]\n");
    return 2;
  }
  std::filesystem::create_directories(dir);
  if (!nvme.empty()) std::filesystem::create_directories(nvme);
  auto comms = strata::comm::CreateInProcessGroup(world, strata::comm::Options{});
  std::vector<Round> rounds_out;
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = Run(r, world, *comms[r], dir, hidden, rounds, optimizer_threads, nvme, &rounds_out); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::vector<double> sync, stall, total, call, rss, alone, sync_cpu, alone_cpu;
  uint64_t bytes = 0, host = 0;
  for (const Round& r : rounds_out) {
    sync.push_back(r.sync_s);
    stall.push_back(r.async_call_s + r.async_steps_extra_s);
    total.push_back(r.async_total_s);
    call.push_back(r.async_call_s);
    rss.push_back(static_cast<double>(r.rss_growth));
    alone.push_back(r.async_alone_s);
    sync_cpu.push_back(r.sync_cpu_s);
    alone_cpu.push_back(r.alone_cpu_s);
    bytes = r.bytes;
    host = std::max(host, r.snapshot_host + r.snapshot_staging);
  }
  std::printf(
      "{\"bytes\": %llu, \"sync_stall_s\": %.4f, \"async_stall_s\": %.4f, \"stall_ratio\": %.4f, "
      "\"async_total_s\": %.4f, \"async_MBps\": %.1f, \"sync_MBps\": %.1f, \"async_call_s\": %.4f, "
      "\"snapshot_host_MB\": %.3f, \"rss_growth_MB\": %.1f, \"async_alone_MBps\": %.1f, \"sync_cpu_s\": %.3f, "
      "\"alone_cpu_s\": %.3f}\n",
      static_cast<unsigned long long>(bytes), Median(sync), Median(stall), Median(stall) / Median(sync), Median(total),
      bytes / 1e6 / Median(total), bytes / 1e6 / Median(sync), Median(call), host / 1e6, Median(rss) / 1e6,
      bytes / 1e6 / Median(alone), Median(sync_cpu), Median(alone_cpu));
  return 0;
}
