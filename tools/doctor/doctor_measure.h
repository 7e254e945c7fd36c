// `strata doctor --measure`: this host's rates, the figures `strata plan --device-preset host
// --host-figures FILE` predicts a step from (docs/decisions/0017-strata-plan.md, "Amendment: measured
// host figures").
//
//   sgemm:  the model's own host product (spec::ModelSpec::HostProduct; the GPT's kernels::cpu::MatmulForward
//           on [B*T, C] x [C, 4C], the call `strata bench step` reports as sgemm_gflops_per_rank), once alone
//           and once on R threads at the same moment (R ranks share the node: each gets what one of the R
//           gets; their mean).
//   update: `strata bench adam --json --threads 1` as a child (the engine's host AdamW, best rep).
//   comm:   `LAUNCHER -n R strata bench comm --json` as a child, twice: at comm_bytes for the bus
//           bandwidths (the MPI back-end's, not raw MPI's), and at alpha_bytes with more repetitions for
//           the per-step latency: alpha = (t_small - m_small / B) / (R - 1), B = (m_big - m_small) /
//           (t_big - t_small) from the two all-gathers (t = m / busbw, m the bytes each rank moves).
// The doctor itself never initialises MPI; a child that cannot start (no launcher, R = 1, the doctor
// itself under a launcher) leaves the comm figures 0 and says why in comm_error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "tools/doctor/doctor_facts.h"

namespace strata::tools::doctor {

struct MeasureOptions {
  int ranks = 1;                 // R
  int sgemm_m = 0, sgemm_k = 0, sgemm_n = 0;
  double sgemm_seconds = 0.5;    // per sample
  // GFLOP/s of the model's host product on [m, k] x [k, n] for `seconds` (ModelSpec::HostProductGflops).
  std::function<double(int m, int k, int n, double seconds)> sgemm;
  uint64_t adam_elems = uint64_t{1} << 24;
  uint64_t comm_bytes = uint64_t{4} << 20;
  uint64_t alpha_bytes = 4096;
  int comm_iters = 5, alpha_iters = 50;
  std::string launcher;          // mpirun / mpiexec / srun path ("" = none found)
  bool under_launcher = false;   // this process was started by one: no nested launch
  // Each child (bench adam, each launch of bench comm) gets this long, then its process group is ended
  // and the figure it was for is reported not measured, naming the command and the timeout. 120 s is
  // generous: at the default sizes each child takes a few seconds on a loaded 2-core host (mpirun's
  // start-up included); a hung launcher or rank must not hang the doctor.
  std::chrono::milliseconds child_timeout{120000};
};

HostFigures MeasureHost(const MeasureOptions& o);

// alpha in seconds from two all-gather bus bandwidths over p ranks (bytes = the full buffers); 0 when the
// two points do not give a positive bandwidth (noise at small sizes) or p < 2.
double AlphaFromTwoSizes(uint64_t small_bytes, double small_busbw, uint64_t big_bytes, double big_busbw, int p);

}  // namespace strata::tools::doctor
