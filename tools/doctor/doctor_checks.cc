// `strata doctor` verdicts over recorded facts. See doctor_checks.h for the fail / warn / ok rules;
// each function below states its thresholds. No function here reads the machine.
#include "tools/doctor/doctor_checks.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "tools/plan/plan.h"

namespace strata::tools::doctor {
namespace {

CheckResult Make(const char* name, Verdict v, std::string detail) { return {name, v, std::move(detail)}; }

std::string Gbps(double bytes_per_s) { return absl::StrFormat("%.2f GB/s", bytes_per_s / 1e9); }

// "9.67 MiB (10137600 bytes)": the exact figure too, as the engine's own NVMe errors give it.
std::string BytesText(uint64_t bytes) { return absl::StrCat(FormatBytes(bytes), " (", bytes, " bytes)"); }

std::string LimitText(uint64_t limit) { return limit == kUnlimited ? "unlimited" : FormatBytes(limit); }

uint64_t TotalVram(const DoctorFacts& f) {
  uint64_t total = 0;
  for (const GpuFacts& g : f.gpus) total += g.memory_bytes;
  return total;
}

// Bits that mean the card is slowed by heat or power delivery, not by being idle or capped by policy.
constexpr uint64_t kBadThrottle = kThrottleHwSlowdown | kThrottleSwThermal | kThrottleHwThermal | kThrottleHwPowerBrake;

// The first NCCL release built for each CUDA major (NCCL release notes): 2.7.3 for CUDA 11,
// 2.16.2 for 12, 2.27.7 for 13. An older NCCL next to a newer runtime is a mismatched install.
int MinNcclFor(int cuda_major) {
  if (cuda_major >= 13) return 22707;
  if (cuda_major == 12) return 21602;
  if (cuda_major == 11) return 2703;
  return 0;
}

// NCCL codes changed encoding at 2.9; compare in one scale.
int NcclComparable(int v) { return v >= 10000 ? v : (v / 1000) * 10000 + (v % 1000); }

const char* TopologyName(int level) {
  switch (level) {
    case kTopoInternal: return "same board";
    case kTopoSingle: return "PCIe switch";
    case kTopoMultiple: return "PCIe switches";
    case kTopoHostBridge: return "host bridge";
    case kTopoNode: return "NUMA node";
    case kTopoSystem: return "cross-socket";
    default: return "unknown";
  }
}

}  // namespace

const char* VerdictName(Verdict v) { return v == Verdict::kOk ? "ok" : v == Verdict::kWarn ? "warn" : "fail"; }

std::string CudaVersionText(int v) {
  return v <= 0 ? "not found" : absl::StrCat(v / 1000, ".", (v % 1000) / 10);
}

std::string NcclVersionText(int v) {
  if (v <= 0) return "not found";
  if (v >= 10000) return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  return absl::StrCat(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
}

std::string ThrottleText(uint64_t reasons) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {kThrottleGpuIdle, "idle"},         {kThrottleAppClocks, "application_clocks"},
      {kThrottleSwPowerCap, "sw_power_cap"}, {kThrottleHwSlowdown, "hw_slowdown"},
      {kThrottleSyncBoost, "sync_boost"}, {kThrottleSwThermal, "sw_thermal"},
      {kThrottleHwThermal, "hw_thermal"}, {kThrottleHwPowerBrake, "hw_power_brake"},
      {kThrottleDisplayClocks, "display_clocks"}};
  std::vector<std::string> names;
  for (const auto& [bit, name] : kNames) {
    if (reasons & bit) names.push_back(name);
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

// warn: no GPU (the host back-end still runs), or CUDA_VISIBLE_DEVICES hides all of them.
// fail: models differ, or the same model with total memory more than 1% apart (MIG / ECC settings).
CheckResult CheckGpus(const DoctorFacts& f) {
  if (!f.nvml_loaded) {
    return Make("gpus", Verdict::kWarn,
                absl::StrCat("no GPU visible (", f.nvml_error, "); strata runs on the host back-end"));
  }
  if (f.gpus.empty()) return Make("gpus", Verdict::kWarn, "NVML loaded but reports no GPU");
  std::map<std::string, int> models;
  uint64_t lo = ~uint64_t{0}, hi = 0;
  for (const GpuFacts& g : f.gpus) {
    ++models[g.name];
    lo = std::min(lo, g.memory_bytes);
    hi = std::max(hi, g.memory_bytes);
  }
  if (models.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [name, n] : models) parts.push_back(absl::StrCat(n, " x ", name));
    return Make("gpus", Verdict::kFail,
                absl::StrCat("GPUs differ (", absl::StrJoin(parts, ", "), "): every rank waits for the slowest"));
  }
  if (double(hi - lo) > 0.01 * double(hi)) {
    return Make("gpus", Verdict::kFail,
                absl::StrCat("same model, memory from ", FormatBytes(lo), " to ", FormatBytes(hi),
                             " (MIG or ECC settings differ?): per-rank budgets would differ"));
  }
  std::string detail = absl::StrCat(f.gpus.size(), " x ", f.gpus[0].name, ", ", FormatBytes(hi), " each");
  if (f.cuda_visible_devices) {
    const std::string& cvd = *f.cuda_visible_devices;
    if (cvd.empty() || cvd == "-1" || cvd == "none") {
      return Make("gpus", Verdict::kWarn,
                  absl::StrCat(detail, ", but CUDA_VISIBLE_DEVICES='", cvd, "' hides them all"));
    }
    absl::StrAppend(&detail, "; CUDA_VISIBLE_DEVICES=", cvd, " (NVML lists every GPU regardless)");
  }
  return Make("gpus", Verdict::kOk, detail);
}

// fail: the CUDA runtime's major version is newer than the driver supports (CUDA refuses to start).
// warn: runtime minor newer than the driver's (minor-version compatibility: runs, PTX JIT does not);
//       NCCL missing, or older than the first release built for the runtime's CUDA major.
CheckResult CheckVersions(const DoctorFacts& f) {
  const VersionFacts& v = f.versions;
  const std::string driver = v.driver.empty()
                                 ? "no NVIDIA driver"
                                 : absl::StrCat("driver ", v.driver, " (CUDA ", CudaVersionText(v.driver_cuda), ")");
  const std::string found = absl::StrCat(driver, ", runtime ", CudaVersionText(v.cuda_runtime), ", NCCL ",
                                         NcclVersionText(v.nccl));
  if (f.gpus.empty()) return Make("versions", Verdict::kOk, absl::StrCat(found, ": nothing to match without a GPU"));
  if (v.driver_cuda <= 0)
    return Make("versions", Verdict::kWarn, absl::StrCat(found, ": the driver's CUDA level is unknown"));
  if (v.cuda_runtime <= 0) {
    return Make("versions", Verdict::kWarn,
                absl::StrCat(found, ": libcudart not loadable (", v.cuda_runtime_error, ")"));
  }
  const int rt_major = v.cuda_runtime / 1000, drv_major = v.driver_cuda / 1000;
  if (rt_major > drv_major) {
    return Make("versions", Verdict::kFail,
                absl::StrCat(found, ": the runtime needs a driver for CUDA ", rt_major, ".x; update the driver"));
  }
  if (rt_major == drv_major && v.cuda_runtime > v.driver_cuda) {
    return Make("versions", Verdict::kWarn,
                absl::StrCat(found, ": runtime newer than the driver (minor-version compatibility; no PTX JIT)"));
  }
  if (v.nccl <= 0) {
    return Make("versions", Verdict::kWarn, absl::StrCat(found, ": NCCL not loadable (", v.nccl_error, ")"));
  }
  if (NcclComparable(v.nccl) < MinNcclFor(rt_major)) {
    return Make("versions", Verdict::kWarn,
                absl::StrCat(found, ": NCCL predates CUDA ", rt_major, " (first built for it: ",
                             NcclVersionText(MinNcclFor(rt_major)), ")"));
  }
  return Make("versions", Verdict::kOk, absl::StrCat(found, ": compatible"));
}

// warn: any pair whose common ancestor is the socket interconnect (NVML SYSTEM, nvidia-smi "SYS") and
// has no NVLink, or a topology NVML could not read. NVLink, switches, host bridges, NUMA node: ok.
CheckResult CheckInterconnect(const DoctorFacts& f) {
  const size_t n = f.gpus.size();
  if (n < 2) return Make("interconnect", Verdict::kOk, n == 0 ? "no GPU: no pairs" : "one GPU: no pairs");
  if (f.topology.size() != n) return Make("interconnect", Verdict::kWarn, "GPU topology not readable through NVML");
  std::map<std::string, int> counts;
  std::vector<std::string> cross, unknown;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const bool nvlink = f.nvlink.size() == n && f.nvlink[i].size() == n && f.nvlink[i][j];
      const int level = f.topology[i].size() == n ? f.topology[i][j] : kTopoUnknown;
      const std::string pair = absl::StrCat(i, "-", j);
      ++counts[nvlink ? "NVLink" : TopologyName(level)];
      if (!nvlink && level == kTopoSystem) cross.push_back(pair);
      if (!nvlink && level == kTopoUnknown) unknown.push_back(pair);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [kind, c] : counts) parts.push_back(absl::StrCat(c, " ", kind));
  const std::string summary = absl::StrCat(n * (n - 1) / 2, " pairs: ", absl::StrJoin(parts, ", "));
  if (!cross.empty()) {
    return Make("interconnect", Verdict::kWarn,
                absl::StrCat(summary, "; pairs ", absl::StrJoin(cross, " "),
                             " cross the CPU socket: collectives run at socket-link speed"));
  }
  if (!unknown.empty()) {
    return Make("interconnect", Verdict::kWarn,
                absl::StrCat(summary, "; pairs ", absl::StrJoin(unknown, " "), " unreadable"));
  }
  return Make("interconnect", Verdict::kOk, summary);
}

// warn: a link running narrower than its maximum (a bad slot or riser), or a maximum below gen 3.
// A current generation below the maximum is normal at idle (links downshift to save power).
CheckResult CheckPcie(const DoctorFacts& f) {
  if (f.gpus.empty()) return Make("pcie", Verdict::kOk, "no GPU");
  std::vector<std::string> problems, links;
  for (const GpuFacts& g : f.gpus) {
    if (g.pcie_max_width < 0 || g.pcie_max_gen < 0) continue;
    links.push_back(absl::StrCat("gen ", g.pcie_gen, "/", g.pcie_max_gen, " x", g.pcie_width, "/", g.pcie_max_width));
    if (g.pcie_width >= 0 && g.pcie_width < g.pcie_max_width) {
      problems.push_back(absl::StrCat("GPU ", g.index, " runs x", g.pcie_width, " of x", g.pcie_max_width));
    }
    if (g.pcie_max_gen < 3) problems.push_back(absl::StrCat("GPU ", g.index, " tops out at gen ", g.pcie_max_gen));
  }
  if (links.empty()) return Make("pcie", Verdict::kOk, "link generation and width not reported (e.g. SXM-only)");
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  const std::string summary = absl::StrCat("current/max: ", absl::StrJoin(links, "; "));
  if (!problems.empty()) {
    return Make("pcie", Verdict::kWarn, absl::StrCat(absl::StrJoin(problems, "; "), " (", summary, ")"));
  }
  return Make("pcie", Verdict::kOk, absl::StrCat(summary, " (a lower current gen is normal at idle)"));
}

// warn: a thermal, hardware-slowdown or power-brake throttle reason is active on any GPU.
CheckResult CheckClocks(const DoctorFacts& f) {
  if (f.gpus.empty()) return Make("clocks", Verdict::kOk, "no GPU");
  std::vector<std::string> bad, all;
  for (const GpuFacts& g : f.gpus) {
    const std::string clocks = absl::StrCat("SM ", g.sm_clock_mhz, "/", g.sm_max_clock_mhz, " MHz");
    all.push_back(absl::StrCat(g.index, ": ", clocks, " ", ThrottleText(g.throttle_reasons)));
    if (g.throttle_reasons & kBadThrottle) {
      bad.push_back(
          absl::StrCat("GPU ", g.index, " ", ThrottleText(g.throttle_reasons & kBadThrottle), " (", clocks, ")"));
    }
  }
  if (!bad.empty()) {
    return Make("clocks", Verdict::kWarn, absl::StrCat(absl::StrJoin(bad, "; "), ": check cooling and power"));
  }
  return Make("clocks", Verdict::kOk, absl::StrCat("no thermal or power throttling; ", absl::StrJoin(all, "; ")));
}

// warn: fewer than 4 usable cores per GPU (data loading, the host optimizer and the communication
// progress threads compete). 4-8 is the recommended range; more is fine.
CheckResult CheckCpuCores(const DoctorFacts& f) {
  if (f.cpu_cores <= 0) return Make("cpu_cores", Verdict::kWarn, "usable CPU count not readable");
  if (f.gpus.empty()) return Make("cpu_cores", Verdict::kOk, absl::StrCat(f.cpu_cores, " cores usable (no GPU)"));
  const double per = double(f.cpu_cores) / double(f.gpus.size());
  const std::string text =
      absl::StrFormat("%.1f cores per GPU (%d cores / %d GPUs)", per, f.cpu_cores, int(f.gpus.size()));
  if (per < 4) return Make("cpu_cores", Verdict::kWarn, text + ": 4-8 recommended; data loading may stall the GPUs");
  return Make("cpu_cores", Verdict::kOk, text + (per > 8 ? ": more than the 4-8 needed" : ": within 4-8"));
}

// warn: host RAM below the total VRAM (host offload and checkpoint staging need at least as much).
CheckResult CheckHostRam(const DoctorFacts& f) {
  if (f.host_ram_bytes == 0) return Make("host_ram", Verdict::kWarn, "host RAM size not readable");
  const std::string ram = FormatBytes(f.host_ram_bytes);
  if (f.gpus.empty()) return Make("host_ram", Verdict::kOk, absl::StrCat(ram, " host RAM (no GPU)"));
  const uint64_t vram = TotalVram(f);
  const std::string text = absl::StrCat(ram, " host RAM for ", FormatBytes(vram), " total VRAM");
  if (f.host_ram_bytes < vram) {
    return Make("host_ram", Verdict::kWarn, text + ": below 1x; host offload and checkpoint staging will not fit");
  }
  return Make("host_ram", Verdict::kOk, absl::StrFormat("%s (%.1fx)", text, double(f.host_ram_bytes) / double(vram)));
}

// warn: io_uring refused (old kernel, seccomp, kernel.io_uring_disabled): NVMe I/O falls back to threads.
CheckResult CheckIoUring(const DoctorFacts& f) {
  if (f.io_uring_ok) return Make("io_uring", Verdict::kOk, "io_uring_queue_init succeeded");
  return Make("io_uring", Verdict::kWarn,
              absl::StrCat("io_uring unavailable (", f.io_uring_error,
                           "): NVMe offload would use the slower pread/pwrite thread pool"));
}

// fail: the disk test itself failed (path missing, not writable). warn: O_DIRECT refused,
// or below 1 GB/s read / 0.5 GB/s write (slower than a typical NVMe drive: offload will be I/O-bound).
// A disk too full for the test is not a verdict on the disk: ok, saying why (nvme_space judges the job's fit).
CheckResult CheckNvme(const DoctorFacts& f) {
  const NvmeFacts& n = f.nvme;
  if (n.path.empty()) return Make("nvme", Verdict::kOk, absl::StrCat("not tested: ", n.skipped_reason));
  if (n.error.empty() && !n.skipped_reason.empty()) {
    return Make("nvme", Verdict::kOk,
                absl::StrCat(n.path, ": bandwidth ", n.skipped_reason, "; whether the job fits: see nvme_space"));
  }
  if (!n.error.empty()) return Make("nvme", Verdict::kFail, absl::StrCat(n.path, ": ", n.error));
  const std::string text =
      absl::StrCat(n.path, ": write ", Gbps(n.write_bytes_per_s), ", read ", Gbps(n.read_bytes_per_s), " (",
                   FormatBytes(n.test_bytes), ", ", n.direct_io ? "O_DIRECT" : "buffered", ")");
  if (!n.direct_io) return Make("nvme", Verdict::kWarn, text + ": O_DIRECT refused (tmpfs or overlay?)");
  if (n.read_bytes_per_s < 1e9 || n.write_bytes_per_s < 0.5e9) {
    return Make("nvme", Verdict::kWarn, text + ": slower than a typical NVMe drive; offload will be I/O-bound");
  }
  return Make("nvme", Verdict::kOk, text);
}

// fail: a disk without room for R x the need, R = the ranks of this node (each rank preallocates its stores
// before its first step and the job stops there naming the path: Note [NVMe room agreed] in engine.cc), or a
// path that cannot be read (the job cannot create its files). warn: room for that but not for R x (need + room):
// the state's store stays at once and the steps over an asynchronous save wait for its writer (decision 0059).
CheckResult CheckNvmeSpace(const DoctorFacts& f) {
  const NvmeSpaceFacts& s = f.nvme_space;
  const std::string checkpoints = "; checkpoints saved on the same disk need their own room besides";
  if (!s.offloaded) return Make("nvme_space", Verdict::kOk, "the config keeps nothing on NVMe");
  if (!s.error.empty()) {
    return Make("nvme_space", Verdict::kWarn, absl::StrCat("the job's NVMe need could not be computed: ", s.error));
  }
  const uint64_t r = static_cast<uint64_t>(std::max(1, s.ranks_on_node));
  const std::string ranks = absl::StrCat(r, r == 1 ? " rank" : " ranks");
  Verdict worst = Verdict::kOk;
  std::vector<std::string> parts;
  for (const NvmeDiskFacts& d : s.disks) {
    const std::string who = absl::StrCat(d.path, " (", d.stores, ")");
    if (!d.error.empty()) {
      worst = Verdict::kFail;
      parts.push_back(absl::StrCat(who, ": ", d.error, ": the job cannot create its NVMe files there"));
      continue;
    }
    const uint64_t need = r * d.need_per_rank, full = r * (d.need_per_rank + d.room_per_rank);
    const std::string free = absl::StrCat(BytesText(d.free_bytes), " free");
    const std::string needs = r == 1 ? absl::StrCat(BytesText(need), " for 1 rank")
                                     : absl::StrCat(ranks, " x ", BytesText(d.need_per_rank), " = ", BytesText(need));
    if (d.free_bytes < need) {
      worst = Verdict::kFail;
      parts.push_back(absl::StrCat(who, ": needs ", needs, ", ", free,
                                   ": the job cannot start (each rank preallocates its stores before training)"));
    } else if (d.free_bytes < full) {
      worst = std::max(worst, Verdict::kWarn);
      const std::string room = absl::StrCat(ranks, " x ", BytesText(d.room_per_rank));
      parts.push_back(absl::StrCat(who, ": ", free, " holds the need, ", needs,
                                   ", but not the state's room for asynchronous checkpoints besides (", room,
                                   "): it trains, but steps over an asynchronous checkpoint wait for its writer"));
    } else if (d.room_per_rank > 0) {
      const std::string each = absl::StrCat(FormatBytes(d.need_per_rank), " need + ", FormatBytes(d.room_per_rank),
                                            " room for asynchronous checkpoints");
      parts.push_back(absl::StrCat(who, ": ", free, " holds ", ranks, " x (", each, ") = ", BytesText(full)));
    } else {
      parts.push_back(absl::StrCat(who, ": ", free, " holds ", needs));
    }
  }
  return Make("nvme_space", worst, absl::StrCat(absl::StrJoin(parts, "; "), checkpoints));
}

// warn: built without MPI, or no launcher on PATH and not started by one (multi-rank runs cannot start).
CheckResult CheckMpi(const DoctorFacts& f) {
  const MpiFacts& m = f.mpi;
  if (!m.built_with_mpi)
    return Make("mpi", Verdict::kWarn, "built without MPI (STRATA_WITH_MPI=OFF): one process only");
  if (f.launch.torchrun) {
    return Make("mpi", Verdict::kOk, absl::StrCat(m.library_version, "; under torchrun each process is a 1-rank MPI "
                                                  "singleton (see launch)"));
  }
  if (m.launcher_world_size > 0) {
    return Make("mpi", Verdict::kOk,
                absl::StrCat(m.library_version, "; started by a launcher, ", m.launcher_world_size, " processes"));
  }
  if (m.launcher_path.empty()) {
    return Make("mpi", Verdict::kWarn, absl::StrCat(m.library_version, "; no mpirun, mpiexec or srun on PATH"));
  }
  return Make("mpi", Verdict::kOk, absl::StrCat(m.library_version, "; launcher ", m.launcher_path));
}

// Under torchrun: fail when its variables are wrong or rank 0's id exchange cannot be reached (the
// message says why); warn when more than one rank will find no GPU, since the host back-end then
// refuses the launch (it needs mpirun). Not under torchrun: ok, nothing to check (mpi covers mpirun).
CheckResult CheckLaunch(const DoctorFacts& f) {
  const LaunchFacts& l = f.launch;
  if (!l.torchrun) return Make("launch", Verdict::kOk, "not started by torchrun (mpirun and srun: see mpi)");
  if (!l.error.empty()) return Make("launch", Verdict::kFail, l.error);
  const std::string who = absl::StrCat("torchrun rank ", l.rank, " of ", l.size);
  if (l.size == 1) return Make("launch", Verdict::kOk, who + ": nothing to exchange");
  const std::string text = absl::StrCat(who, ": id exchange with rank 0 (", l.rank0_host, ") at ", l.exchange, " in ",
                                        absl::StrFormat("%.1f", l.exchange_ms), " ms");
  if (f.gpus.empty()) {
    return Make("launch", Verdict::kWarn,
                text + ", but no GPU: strata train on the host refuses a multi-rank torchrun launch (use mpirun)");
  }
  return Make("launch", Verdict::kOk, text);
}

// fail: the configuration pins more per rank than RLIMIT_MEMLOCK allows (pinning would fail).
CheckResult CheckMemlock(const DoctorFacts& f) {
  const PinnedFacts& p = f.pinned;
  const std::string limit = LimitText(f.memlock_limit_bytes);
  if (!p.offloaded) {
    return Make("memlock", Verdict::kOk,
                absl::StrCat("limit ", limit, "; nothing is offloaded, so no pinned buffers are needed"));
  }
  if (!p.pinned) {
    return Make("memlock", Verdict::kOk, absl::StrCat("limit ", limit, "; offload with pin_memory=false pins nothing"));
  }
  const std::string need = absl::StrCat(FormatBytes(p.bytes_per_rank), " pinned per rank (", p.breakdown, ")");
  if (f.memlock_limit_bytes != kUnlimited && f.memlock_limit_bytes < p.bytes_per_rank && f.lock_past_limit) {
    return Make("memlock", Verdict::kOk,
                absl::StrCat("limit ", limit, " < ", need,
                             ", but this process holds CAP_IPC_LOCK (root), which "
                             "locks past the limit: a job of this user pins; another user's needs ulimit -l "
                             "unlimited"));
  }
  if (f.memlock_limit_bytes != kUnlimited && f.memlock_limit_bytes < p.bytes_per_rank) {
    return Make("memlock", Verdict::kFail,
                absl::StrCat("limit ", limit, " < ", need, ": raise it (ulimit -l unlimited; --ulimit memlock=-1)"));
  }
  return Make("memlock", Verdict::kOk, absl::StrCat("limit ", limit, " covers ", need));
}

CheckResult CheckHostFigures(const DoctorFacts& f) {
  const HostFigures& h = f.host;
  std::string d = absl::StrFormat("sgemm %.1f GFLOP/s per rank at %d ranks (%.1f alone; %dx%dx%d), update %.2f GB/s",
                                  h.matmul_gflops, h.ranks, h.matmul_gflops_one_rank, h.sgemm_m, h.sgemm_k,
                                  h.sgemm_n, h.update_gbps);
  if (h.comm_error.empty()) {
    absl::StrAppendFormat(&d, ", all-gather %.3f / reduce-scatter %.3f / all-reduce %.3f GB/s, alpha %.1f us",
                          h.allgather_gbps, h.reduce_scatter_gbps, h.allreduce_gbps, h.alpha_us);
  }
  Verdict v = Verdict::kOk;
  if (!h.update_error.empty()) {
    v = Verdict::kWarn;
    absl::StrAppend(&d, "; update not measured: ", h.update_error);
  }
  if (!h.comm_error.empty()) {
    v = Verdict::kWarn;
    absl::StrAppend(&d, "; collectives not measured: ", h.comm_error);
  }
  if (h.omp_num_threads.empty()) {
    v = Verdict::kWarn;
    absl::StrAppend(&d, "; OMP_NUM_THREADS unset: each product used every core");
  }
  return Make("host figures", v, d);
}

std::vector<CheckResult> RunChecks(const DoctorFacts& f) {
  std::vector<CheckResult> c = {CheckGpus(f),   CheckVersions(f),  CheckInterconnect(f), CheckPcie(f),
                                CheckClocks(f), CheckCpuCores(f),  CheckHostRam(f),      CheckIoUring(f),
                                CheckNvme(f),   CheckNvmeSpace(f), CheckMpi(f),          CheckLaunch(f),
                                CheckMemlock(f)};
  if (f.host.measured) c.push_back(CheckHostFigures(f));
  return c;
}

Verdict Worst(const std::vector<CheckResult>& checks) {
  Verdict w = Verdict::kOk;
  for (const CheckResult& c : checks) w = std::max(w, c.verdict);
  return w;
}

// Note [Pinned estimate]
// DeepSpeed semantics, per rank, P params over N ranks (shard = ceil(P / N)):
//  - offload_optimizer cpu: fp32 grad + master + Adam m, v = 16 B x shard (the 16 of docs/decisions/0001).
//  - offload_optimizer nvme: the fp32 grad shard stays pinned in host (4 B x shard) and
//    engine::NvmeStagingTiles fp32 staging tiles (max(buffer_count, 9) for Adam) of engine::NvmeTileElems
//    elements stream master, m, v (engine Note [NVMe state]).
//  - offload_param cpu: the param shard in param_dtype; nvme: engine::NvmeParamBuffers buffers of one
//    unit's shard, 4 KiB-rounded (engine Note [NVMe params]).
// A kind with pin_memory=false pins nothing. The largest unit is the model's, unpadded (for the GPT the
// embedding (V + T) x C or a block (12 C^2 + 13 C), whichever is bigger).
PinnedFacts EstimatePinned(const engine::EngineConfig& cfg, const spec::ModelSpec& model, int ranks) {
  using engine::OffloadDevice;
  PinnedFacts p;
  const uint64_t n = static_cast<uint64_t>(std::max(1, ranks));
  const uint64_t params = static_cast<uint64_t>(model.NumParams());
  const std::vector<spec::UnitSpec> units = model.Units();
  uint64_t unit = 0;
  for (const spec::UnitSpec& u : units) {
    uint64_t elems = 0;
    for (const shard::ParamSpec& s : u.params) {
      uint64_t numel = 1;
      for (const int64_t d : s.shape) numel *= static_cast<uint64_t>(d);
      elems += numel;
    }
    unit = std::max(unit, elems);
  }
  const uint64_t shard = (params + n - 1) / n, unit_shard = (unit + n - 1) / n;
  const uint64_t dtype = DTypeBytes(cfg.param_dtype);
  std::vector<std::string> parts;
  auto add = [&](const engine::OffloadConfig& o, const char* what, uint64_t cpu_bytes, uint64_t nvme_bytes) {
    if (o.device == OffloadDevice::kNone) return;
    p.offloaded = true;
    if (!o.pin_memory) return;
    const uint64_t b = o.device == OffloadDevice::kCpu ? cpu_bytes : nvme_bytes;
    p.bytes_per_rank += b;
    parts.push_back(absl::StrCat(what, o.device == OffloadDevice::kCpu ? " on cpu " : " via nvme ", FormatBytes(b)));
  };
  // The engine's own sizing (engine/config.h) over the units the model registers.
  const uint64_t tile = engine::NvmeTileElems(cfg, unit_shard);
  add(cfg.offload_optimizer, "optimizer", 16 * shard, 4 * shard + engine::NvmeStagingTiles(cfg) * 4 * tile);
  const uint64_t param_buffers =
      engine::NvmeParamBuffers(cfg, engine::LiveGatheredUnits(cfg, static_cast<int>(units.size())));
  add(cfg.offload_param, "params", dtype * shard, param_buffers * ((dtype * unit_shard + 4095) / 4096 * 4096));
  p.pinned = p.bytes_per_rank > 0;
  p.breakdown = absl::StrCat(absl::StrJoin(parts, " + "), "; ", params, " params over ", n, " ranks");
  return p;
}

absl::StatusOr<NvmeSpaceFacts> EstimateNvmeSpace(const engine::EngineConfig& cfg,
                                                 std::shared_ptr<const spec::ModelSpec> model, int ranks,
                                                 int ranks_on_node) {
  using engine::OffloadDevice;
  NvmeSpaceFacts s;
  s.ranks = std::max(1, ranks);
  s.ranks_on_node = std::clamp(ranks_on_node, 1, s.ranks);
  const bool params = cfg.offload_param.device == OffloadDevice::kNvme;
  const bool optimizer = cfg.offload_optimizer.device == OffloadDevice::kNvme;
  s.offloaded = params || optimizer;
  if (!s.offloaded) return s;
  plan::PlanInput in;
  in.model = std::move(model);
  in.engine = cfg;
  in.ranks = s.ranks;
  in.ranks_per_node = s.ranks_on_node;
  // G as `strata plan` and the engine take it: "node" is the ranks sharing this host, 0 the world.
  const int g = cfg.shard_group_size;
  in.shard_group = g == engine::kShardGroupNode ? s.ranks_on_node : g;
  in.device.gpu = false;  // the device and pinned tiers depend on it; the NVMe stores do not
  STRATA_ASSIGN_OR_RETURN(const plan::MemoryPlan m, plan::PlanMemory(in));
  // The NVMe tier holds the two stores (accounting.cc): the optimizer state's, whose size nvme_room repeats (the
  // room is that store once more), and the parameter shards', the rest.
  const uint64_t nvme = m.engine.tier[static_cast<int>(memory::Tier::kNvme)];
  const uint64_t state = optimizer ? std::min(m.engine.nvme_room, nvme) : 0;
  auto add = [&](const std::string& path, const char* what, uint64_t need, uint64_t room) {
    for (NvmeDiskFacts& d : s.disks) {
      if (d.path != path) continue;
      absl::StrAppend(&d.stores, " + ", what);
      d.need_per_rank += need;
      d.room_per_rank += room;
      return;
    }
    NvmeDiskFacts d;
    d.path = path;
    d.stores = what;
    d.need_per_rank = need;
    d.room_per_rank = room;
    s.disks.push_back(std::move(d));
  };
  if (optimizer) add(cfg.offload_optimizer.nvme_path, "optimizer state", state, m.engine.nvme_room);
  if (params) add(cfg.offload_param.nvme_path, "parameter shards", nvme - state, 0);
  return s;
}

}  // namespace strata::tools::doctor
