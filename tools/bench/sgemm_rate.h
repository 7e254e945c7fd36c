// The host's sgemm rate on the GPT's own product: what `strata bench step` reports as
// sgemm_gflops_per_rank and what `strata doctor --measure` records for `strata plan --host-figures`.
#pragma once

namespace strata::tools {

// GFLOP/s of kernels::cpu::MatmulForward (the trainer's host product, oneDNN sgemm underneath) on a
// [M, K] x [K, N] product, repeated for at least `seconds` after one warm-up call, on the calling thread
// (the product's own threads are oneDNN's: OMP_NUM_THREADS, as in the trainer).
double SgemmGflops(int M, int K, int N, double seconds = 0.5);

}  // namespace strata::tools
