// `strata doctor` output. The JSON carries every fact the verdicts were computed from, so a report
// from a user's machine can be read (and its verdicts recomputed) without access to the machine.
#include "tools/doctor/doctor_report.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/doctor/doctor_checks.h"

namespace strata::tools::doctor {
namespace {

using json = nlohmann::ordered_json;

json GpuToJson(const GpuFacts& g) {
  return {{"index", g.index},
          {"name", g.name},
          {"memory_bytes", g.memory_bytes},
          {"pcie_gen", g.pcie_gen},
          {"pcie_max_gen", g.pcie_max_gen},
          {"pcie_width", g.pcie_width},
          {"pcie_max_width", g.pcie_max_width},
          {"sm_clock_mhz", g.sm_clock_mhz},
          {"sm_max_clock_mhz", g.sm_max_clock_mhz},
          {"throttle_reasons", g.throttle_reasons},
          {"throttle", ThrottleText(g.throttle_reasons)}};
}

json VersionsToJson(const VersionFacts& v) {
  return {{"driver", v.driver},
          {"driver_cuda", v.driver_cuda},
          {"driver_cuda_text", CudaVersionText(v.driver_cuda)},
          {"cuda_runtime", v.cuda_runtime},
          {"cuda_runtime_text", CudaVersionText(v.cuda_runtime)},
          {"cuda_runtime_error", v.cuda_runtime_error},
          {"nccl", v.nccl},
          {"nccl_text", NcclVersionText(v.nccl)},
          {"nccl_error", v.nccl_error}};
}

json NvmeToJson(const NvmeFacts& n) {
  return {{"path", n.path},
          {"skipped_reason", n.skipped_reason},
          {"error", n.error},
          {"direct_io", n.direct_io},
          {"test_bytes", n.test_bytes},
          {"write_bytes_per_s", n.write_bytes_per_s},
          {"read_bytes_per_s", n.read_bytes_per_s}};
}

json NvmeSpaceToJson(const NvmeSpaceFacts& s) {
  json disks = json::array();
  for (const NvmeDiskFacts& d : s.disks) {
    disks.push_back({{"path", d.path},
                     {"stores", d.stores},
                     {"error", d.error},
                     {"free_bytes", d.free_bytes},
                     {"need_per_rank", d.need_per_rank},
                     {"room_per_rank", d.room_per_rank}});
  }
  return {{"offloaded", s.offloaded},
          {"ranks", s.ranks},
          {"ranks_on_node", s.ranks_on_node},
          {"error", s.error},
          {"disks", disks}};
}

// Keys named as `strata plan`'s flags (matmul_gflops is --matmul-gflops): plan_host_figures.cc reads them.
json HostFiguresToJson(const HostFigures& h) {
  return {{"ranks", h.ranks},
          {"omp_num_threads", h.omp_num_threads},
          {"sgemm_shape", {h.sgemm_m, h.sgemm_k, h.sgemm_n}},
          {"matmul_gflops", h.matmul_gflops},
          {"matmul_gflops_one_rank", h.matmul_gflops_one_rank},
          {"update_gbps", h.update_gbps},
          {"update_error", h.update_error},
          {"launcher", h.launcher},
          {"comm_bytes", h.comm_bytes},
          {"alpha_bytes", h.alpha_bytes},
          {"allgather_gbps", h.allgather_gbps},
          {"reduce_scatter_gbps", h.reduce_scatter_gbps},
          {"allreduce_gbps", h.allreduce_gbps},
          {"alpha_us", h.alpha_us},
          {"comm_error", h.comm_error},
          {"seconds", h.seconds}};
}

}  // namespace

json FactsToJson(const DoctorFacts& f) {
  json gpus = json::array();
  for (const GpuFacts& g : f.gpus) gpus.push_back(GpuToJson(g));
  json j = {
      {"nvml", {{"loaded", f.nvml_loaded}, {"error", f.nvml_error}}},
      {"cuda_visible_devices", f.cuda_visible_devices ? json(*f.cuda_visible_devices) : json(nullptr)},
      {"gpu_count", f.gpus.size()},
      {"gpus", gpus},
      {"topology", f.topology},
      {"nvlink", f.nvlink},
      {"versions", VersionsToJson(f.versions)},
      {"cpu_cores", f.cpu_cores},
      {"host_ram_bytes", f.host_ram_bytes},
      {"memlock_limit_bytes", f.memlock_limit_bytes == kUnlimited ? json("unlimited") : json(f.memlock_limit_bytes)},
      {"lock_past_limit", f.lock_past_limit},
      {"io_uring", {{"ok", f.io_uring_ok}, {"error", f.io_uring_error}}},
      {"nvme", NvmeToJson(f.nvme)},
      {"nvme_space", NvmeSpaceToJson(f.nvme_space)},
      {"mpi",
       {{"built_with_mpi", f.mpi.built_with_mpi},
        {"library_version", f.mpi.library_version},
        {"launcher_path", f.mpi.launcher_path},
        {"launcher_world_size", f.mpi.launcher_world_size},
        {"launcher_local_size", f.mpi.launcher_local_size}}},
      {"launch",
       {{"torchrun", f.launch.torchrun},
        {"rank", f.launch.rank},
        {"size", f.launch.size},
        {"exchange", f.launch.exchange},
        {"error", f.launch.error},
        {"exchange_ms", f.launch.exchange_ms},
        {"rank0_host", f.launch.rank0_host}}},
      {"pinned",
       {{"offloaded", f.pinned.offloaded},
        {"pinned", f.pinned.pinned},
        {"bytes_per_rank", f.pinned.bytes_per_rank},
        {"breakdown", f.pinned.breakdown}}},
  };
  if (f.host.measured) j["host_figures"] = HostFiguresToJson(f.host);
  return j;
}

std::string RenderJson(const DoctorFacts& f, const std::vector<CheckResult>& checks) {
  json list = json::array();
  int counts[3] = {0, 0, 0};
  for (const CheckResult& c : checks) {
    list.push_back({{"name", c.name}, {"verdict", VerdictName(c.verdict)}, {"detail", c.detail}});
    ++counts[static_cast<int>(c.verdict)];
  }
  const json out = {{"verdict", VerdictName(Worst(checks))},
                    {"counts", {{"ok", counts[0]}, {"warn", counts[1]}, {"fail", counts[2]}}},
                    {"checks", list},
                    {"facts", FactsToJson(f)}};
  // Replace rather than throw on invalid UTF-8 from a driver string.
  return out.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string RenderTable(const std::vector<CheckResult>& checks) {
  size_t width = 5;  // "check"
  int counts[3] = {0, 0, 0};
  for (const CheckResult& c : checks) {
    width = std::max(width, c.name.size());
    ++counts[static_cast<int>(c.verdict)];
  }
  std::string out = absl::StrFormat("%-*s  %-7s  %s\n", static_cast<int>(width), "check", "verdict", "detail");
  for (const CheckResult& c : checks) {
    absl::StrAppendFormat(&out, "%-*s  %-7s  %s\n", static_cast<int>(width), c.name,
                          absl::AsciiStrToUpper(VerdictName(c.verdict)), c.detail);
  }
  absl::StrAppend(&out, "\n", counts[2], " fail, ", counts[1], " warn, ", counts[0], " ok",
                  counts[2] > 0 ? ": fix the failed checks before training\n" : "\n");
  return out;
}

}  // namespace strata::tools::doctor
