// The capacity bound and the I/O floor: see capacity_bound.h.
#include "tools/bench/capacity_bound.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/optim/optimizer.h"
#include "tools/bench/bench_nvme.h"

namespace strata::tools {

std::vector<std::string> NvmePaths(const engine::EngineConfig& cfg) {
  std::vector<std::string> out;
  for (const engine::OffloadConfig* o : {&cfg.offload_param, &cfg.offload_optimizer}) {
    if (o->device != engine::OffloadDevice::kNvme) continue;
    if (std::find(out.begin(), out.end(), o->nvme_path) == out.end()) out.push_back(o->nvme_path);
  }
  return out;
}

absl::StatusOr<uint64_t> FreeDiskBytes(const std::vector<std::string>& paths) {
  std::vector<dev_t> seen;
  uint64_t free = 0;
  for (const std::string& p : paths) {
    struct stat st {};
    struct statvfs vfs {};
    if (stat(p.c_str(), &st) != 0 || statvfs(p.c_str(), &vfs) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot read free space of '", p, "': ", std::strerror(errno)));
    }
    if (std::find(seen.begin(), seen.end(), st.st_dev) != seen.end()) continue;  // one file system, once
    seen.push_back(st.st_dev);
    free += static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  return free;
}

BytesPerParam MeasureBytesPerParam(const engine::EngineConfig& cfg, const engine::MemoryStats& mem, int64_t params,
                                   int ranks) {
  BytesPerParam b;
  using memory::Kind;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    double bytes = 0;
    for (Kind k : {Kind::kParamShard, Kind::kGradShard, Kind::kMaster, Kind::kOptimizerState}) {
      bytes += static_cast<double>(mem.kind[t][static_cast<int>(k)].current_bytes);
    }
    b.tier[t] = bytes * ranks / static_cast<double>(std::max<int64_t>(params, 1));
    b.total += b.tier[t];
  }
  const double param = static_cast<double>(DTypeBytes(cfg.param_dtype));
  // The fp32 gradient shard is kept unless the update runs in backward (strata.optimizer_in_backward).
  b.formula = param + (cfg.param_dtype == DType::kF32 ? 0 : 4) + 4.0 * optim::StateBuffers(cfg.optimizer) +
              (cfg.optimizer_in_backward ? 0 : 4);
  return b;
}

namespace {

// Prints the terms of the bound's numerator and returns their sum; *unlimited when a tier that holds
// state has no budget.
double PrintRoom(const engine::EngineConfig& cfg, uint64_t free_disk, const BytesPerParam& bpp, int ranks,
                 bool* unlimited) {
  const std::vector<std::string> paths = NvmePaths(cfg);
  // A tier counts when the engine keeps state on it; a budget counts once per rank, the disk once.
  double room = 0;
  if (paths.empty()) {
    std::printf("  free disk     0 B: nothing is offloaded to NVMe\n");
  } else {
    std::printf("  free disk     %s: statvfs of %s before the first candidate\n", FormatBytes(free_disk).c_str(),
                absl::StrJoin(paths, ", ").c_str());
    room += static_cast<double>(free_disk);
  }
  const struct {
    const char* name;
    const char* flag;
    uint64_t budget;
    double held;
    bool named_when_empty;  // the device budget is working memory only when no state stays there
  } budgets[] = {{"host budget", "--host-budget", cfg.host_budget_bytes, bpp.tier[1], true},
                 {"device budget", "--device-budget", cfg.device_budget_bytes, bpp.tier[0], false}};
  for (const auto& b : budgets) {
    const bool limited = b.budget != ~uint64_t{0};
    const std::string size = limited ? FormatBytes(b.budget) : std::string("unlimited");
    if (b.held <= 0 && !b.named_when_empty) continue;
    std::printf("  %-13s %s: %s x %d rank%s%s\n", b.name, size.c_str(), b.flag, ranks, ranks == 1 ? "" : "s",
                b.held > 0 ? "" : " (holds no state here: not counted)");
    if (b.held <= 0) continue;
    *unlimited |= !limited;
    room += limited ? static_cast<double>(b.budget) * ranks : 0;
  }
  return room;
}

}  // namespace

double PrintCapacityBound(const engine::EngineConfig& cfg, uint64_t free_disk, const BytesPerParam& bpp,
                          int64_t largest, int ranks) {
  std::printf("physical bound: (free disk + host budget, and the device budget where state stays there) / bytes kept "
              "per parameter\n");
  bool unlimited = false;
  const double room = PrintRoom(cfg, free_disk, bpp, ranks, &unlimited);
  std::printf(
      "  bytes/param   %.2f: the least this config keeps (param dtype, fp32 master unless the params are fp32,\n"
      "                optimizer state%s); the engine's accounting of the largest model's parameter, gradient,\n"
      "                master and optimizer state: %.2f (device %.2f, pinned_host %.2f, nvme %.2f)\n",
      bpp.formula, cfg.optimizer_in_backward ? "; no gradient: --optimizer-in-backward" : ", fp32 gradient", bpp.total,
      bpp.tier[0], bpp.tier[1], bpp.tier[2]);
  if (unlimited || bpp.formula <= 0) {
    std::printf("  no bound: a budget of a tier that holds state is unlimited\n");
    return 0;
  }
  // The physical bound divides by what must be kept, not by what this engine keeps: bytes the engine
  // holds beyond the least (an fp32 params' copy beside the master, padding) lower the fraction reached.
  const double bound = room / bpp.formula;
  std::printf("  bound         %.4g parameters; the largest model found, %lld, is %.3g of it\n", bound,
              static_cast<long long>(largest), static_cast<double>(largest) / bound);
  return bound;
}

absl::Status PrintIoFloor(const std::vector<std::string>& paths, uint64_t probe_bytes, const StepTiming& t) {
  NvmeBenchOptions o;
  o.paths = paths;
  o.total_bytes = std::max<uint64_t>(probe_bytes / o.block_bytes, 1) * o.block_bytes;
  o.repeat = 3;
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, RunNvmeBench(o));
  const bool fio = j.contains("fio_ioengine");
  const double rbw = j[fio ? "fio_read_bytes_per_s" : "read_bytes_per_s"].get<double>();
  const double wbw = j[fio ? "fio_write_bytes_per_s" : "write_bytes_per_s"].get<double>();
  const double rd = static_cast<double>(t.last.nvme_read_bytes) * t.ranks;
  const double wr = static_cast<double>(t.last.nvme_write_bytes) * t.ranks;
  const double floor_ms = 1e3 * (rd / std::max(rbw, 1.0) + wr / std::max(wbw, 1.0));
  const std::string how =
      fio ? absl::StrCat("fio (", j["fio_ioengine"].get<std::string>(), ")")
          : absl::StrCat("the built-in probe (no fio: ", j.value("fio", std::string("not run")), ")");
  std::printf("I/O floor of the largest model's step, %s measured by %s on %s (%s, %s):\n",
              FormatBytes(o.total_bytes).c_str(), how.c_str(), absl::StrJoin(paths, ", ").c_str(),
              j["fs_type"].get<std::string>().c_str(), j["direct_io"].get<bool>() ? "O_DIRECT" : "buffered");
  std::printf("  read  %s at %.1f MB/s, write %s at %.1f MB/s (the engine's counters of the last step, %d rank%s)\n",
              FormatBytes(static_cast<uint64_t>(rd)).c_str(), rbw / 1e6, FormatBytes(static_cast<uint64_t>(wr)).c_str(),
              wbw / 1e6, t.ranks, t.ranks == 1 ? "" : "s");
  std::printf("  floor %.1f ms, step %.1f ms: step / floor %.2f\n", floor_ms, t.step_ms,
              floor_ms > 0 ? t.step_ms / floor_ms : 0.0);
  std::printf("  split: compute %.1f ms, exposed I/O %.1f ms, optimizer %.1f ms, exposed communication %.1f ms\n",
              t.last.compute_ms, t.last.exposed_io_ms, t.last.optimizer_ms, t.last.exposed_comm_ms);
  // The engine's optimizer time is the whole update, less its collective waits only: the tiled update's
  // waits for NVMe are in it and in exposed I/O both.
  std::printf(
      "  (the optimizer's waits for its NVMe tiles count in exposed I/O too, so the parts can sum past the step)\n");
  return absl::OkStatus();
}

}  // namespace strata::tools
