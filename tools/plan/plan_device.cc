#include "tools/plan/plan_device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::tools::plan {

namespace {

constexpr double kGB = 1e9;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// Hopper SXM in an 8-GPU HGX / DGX node (sources in docs/decisions/0017-strata-plan.md): 989 TFLOP/s
// dense bf16, NVLink 4 at 900 GB/s bidirectional = 450 GB/s each way, one 400 Gb/s ConnectX-7 rail per
// GPU = 50 GB/s each way, PCIe Gen5 x16 = 64 GB/s each way, 2 TB of host memory per DGX node.
// Latencies are typical NCCL step latencies (a few microseconds on NVLink, more across the fabric).
DeviceSpec Hopper(const char* name, uint64_t memory_bytes, double hbm_bytes_per_s) {
  DeviceSpec d;
  d.name = name;
  d.gpu = true;
  d.memory_bytes = memory_bytes;
  d.reserved_bytes = 2 * kGiB;
  d.host_bytes_per_node = 2048 * kGiB;
  d.matmul_flops = 989e12;
  d.memory_bytes_per_s = hbm_bytes_per_s;
  d.host_memory_bytes_per_s = 100 * kGB;
  d.h2d_bytes_per_s = 64 * kGB;
  d.nvme_bytes_per_s = 3 * kGB;
  d.intra = Link{3e-6, 450 * kGB, 450 * kGB, 450 * kGB};
  d.inter = Link{10e-6, 50 * kGB, 50 * kGB, 50 * kGB};
  return d;
}

}  // namespace

std::vector<std::string> DevicePresetNames() { return {"h100-sxm", "h200-sxm", "host"}; }

absl::StatusOr<DeviceSpec> DevicePreset(const std::string& name) {
  if (name == "h100-sxm") return Hopper("h100-sxm", 80 * kGB, 3.35e12);
  if (name == "h200-sxm") return Hopper("h200-sxm", 141 * kGB, 4.8e12);
  if (name == "host") {
    // Only the shape: every rate is this machine's and must be measured (plan_command.cc asks for them).
    DeviceSpec d;
    d.name = "host";
    d.gpu = false;
    return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("--gpu '", name, "' is not a device preset (use ",
                                                 absl::StrJoin(DevicePresetNames(), ", "), ")"));
}

}  // namespace strata::tools::plan
