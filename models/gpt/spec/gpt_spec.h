// The GPT behind the model interface (spec/model_spec.h): its units, workspace, FLOPs, schedule and host
// product are the model's own functions (gpt_config.h, gpt_model.h, nn_backend.h), so that `strata plan`,
// `bench` and `doctor` answer from the code that trains it (docs/decisions/0017-strata-plan.md, 0035).
#pragma once

#include <memory>

#include "models/gpt/model/gpt_config.h"
#include "spec/model_spec.h"

namespace strata::gpt {

// The spec of `cfg` as it is (Validate says what is wrong with it).
std::shared_ptr<const spec::ModelSpec> Spec(const GptConfig& cfg);
// The config a spec made by Spec() describes; nullptr for another family's spec.
const GptConfig* ConfigOf(const spec::ModelSpec& s);

// GFLOP/s of kernels::cpu::MatmulForward (the trainer's host product, oneDNN sgemm underneath) on a
// [M, K] x [K, N] product, repeated for at least `seconds` after one warm-up call, on the calling thread
// (the product's own threads are oneDNN's: OMP_NUM_THREADS, as in the trainer). What `strata bench step`
// reports as sgemm_gflops_per_rank and `strata doctor --measure` records for `strata plan --host-figures`.
double SgemmGflops(int M, int K, int N, double seconds = 0.5);

}  // namespace strata::gpt
