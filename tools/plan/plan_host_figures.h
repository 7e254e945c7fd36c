// `strata plan --device-preset host --host-figures FILE`: this host's rates from `strata doctor --measure
// --json` (facts.host_figures, tools/doctor/doctor_measure.h), instead of one flag per rate. The file came
// from outside: it is read through checkpoint::JsonReader (bounded nesting, typed, every field named), and
// a missing file, bad JSON, a missing or mistyped key, or a rate the doctor could not measure that the plan
// needs is an error naming the file and the key.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spec/flags.h"
#include "tools/plan/plan_device.h"

namespace strata::tools::plan {

struct HostFigures {
  int ranks = 1;                   // the ranks per node the doctor measured for
  int cpu_cores = 0;               // facts.cpu_cores: the cores this process could run on
  double matmul_gflops = 0;        // per rank at `ranks`
  double matmul_gflops_one_rank = 0;
  double update_gbps = 0;
  double allgather_gbps = 0, reduce_scatter_gbps = 0, allreduce_gbps = 0, alpha_us = 0;  // 0: not measured
  std::string comm_error;          // the doctor's reason when they were not
};

// `where` names the document in errors (the path). Accepts the doctor's whole JSON ({"facts":
// {"host_figures": ...}}).
absl::StatusOr<HostFigures> ParseHostFigures(absl::string_view text, const std::string& where);
absl::StatusOr<HostFigures> ReadHostFigures(const std::string& path);

// Sets `d`'s rates from `h` for a job of `ranks` ranks, `ranks_per_node` per node: the sgemm rate measured
// with that many ranks sharing the node (the doctor's `ranks`, or 1), the update rate, the intra-node
// collectives and alpha, and the node's cores (facts.cpu_cores). A rate that `flags` gives (--matmul-gflops,
// --allgather-gbps, --intra-gbps, ...) is left to the flag; a needed one that is neither measured for this shape nor
// given is an error naming `where`, the key and how to get it.
absl::Status ApplyHostFigures(const HostFigures& h, const std::string& where, int ranks, int ranks_per_node,
                              const spec::Flags& flags, DeviceSpec* d);

}  // namespace strata::tools::plan
