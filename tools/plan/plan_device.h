// `strata plan`'s devices: the figures the time model and the fit check read, and the presets.
//
// Link figures are bus bandwidths in the nccl-tests sense (an all-gather of X bytes over p ranks takes
// (p-1)/p * X / bus bandwidth), per rank and direction. The GPU presets carry NVIDIA's published peaks
// (docs/decisions/0017-strata-plan.md cites them); the model applies its efficiencies to them. `host` is
// this kind of machine: its figures are the ones `strata doctor` / `strata bench comm` measure, given by
// flags (no preset could know them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tools::plan {

// One link class: alpha (per message step) and bus bandwidths per collective (they differ on MPI over
// shared memory, docs/design.md "Communication"; equal on NCCL presets).
struct Link {
  double alpha_s = 0;
  double all_gather_bytes_per_s = 0;
  double reduce_scatter_bytes_per_s = 0;
  double all_reduce_bytes_per_s = 0;
};

struct DeviceSpec {
  std::string name;
  bool gpu = true;                 // device tier is device memory (false: host memory, host kernels)
  uint64_t memory_bytes = 0;       // per rank: the device tier
  uint64_t reserved_bytes = 0;     // of it, not for Strata (CUDA context, the back-end's own scratch)
  uint64_t host_bytes_per_node = 0;  // the pinned-host tier, shared by a node's ranks
  double matmul_flops = 0;         // dense rate of the products the run uses (bf16 on GPUs, sgemm on hosts)
  double memory_bytes_per_s = 0;   // what the optimizer update streams through (HBM, or host DRAM)
  double host_memory_bytes_per_s = 0;  // the host update with offload_optimizer
  double h2d_bytes_per_s = 0;      // PCIe per GPU (offload copies); 0 on hosts (nothing to copy)
  double nvme_bytes_per_s = 0;     // per rank
  // Hosts: the cores a node's ranks share (0 = as many as they need). On a host the collectives are CPU
  // work (MPI over shared memory copies and reduces on the ranks' own cores, and polls while it waits), so
  // with fewer than two cores per rank they cannot hide under compute for free (plan_time.cc, Pipeline).
  int cores_per_node = 0;
  Link intra;                      // inside a node (NVLink / shared memory)
  Link inter;                      // across nodes (InfiniBand, per GPU rail)
};

// "h100-sxm", "h200-sxm" or "host".
absl::StatusOr<DeviceSpec> DevicePreset(const std::string& name);
std::vector<std::string> DevicePresetNames();

}  // namespace strata::tools::plan
