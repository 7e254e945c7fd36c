// A small MLP trained through the engine's hooks: the smallest real user of the engine, the model of the
// equivalence, memory and overlap tests, and the `strata` executable's second model family (mlp_spec.h).
//
//   x -> [input: W0,b0, tanh] -> [hidden: W1,b1, tanh] -> [hidden again (tied)] -> [output: W2,b2] -> y
//
// The hidden unit is used twice per pass, so every run exercises a tied unit. Loss: 0.5 * mean over
// samples of the squared error summed over outputs; the targets come from a fixed smooth teacher.
// Samples are a pure function of their global index, so any world size sees the same global batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"

namespace strata::mlp {

struct MlpShape {
  int in = 16;
  int hidden = 48;
  int out = 4;
};

// The units Mlp::Register registers, in order: "input", "hidden", "output", each a linear layer's weight
// [out, in] and bias (what the model's spec lays out: models/mlp/mlp_spec.h).
struct MlpUnit {
  std::string name;
  std::vector<shard::ParamSpec> params;
};
std::vector<MlpUnit> MlpUnits(const MlpShape& shape);

class Mlp {
 public:
  // Registers the three units (collective at Finalize, which the caller runs).
  static absl::StatusOr<Mlp> Register(engine::Engine& engine, const MlpShape& shape, bool perturb_for_test = false);

  // One micro-batch on samples [first, first + count): forward, loss, backward through the hooks.
  // Returns the micro-batch's mean loss.
  absl::StatusOr<double> TrainMicroBatch(engine::Engine& engine, int64_t first, int count,
                                         int64_t compute_delay_us = 0);

  // Deterministic sample `index`: input x (shape.in) and target t (shape.out).
  void Sample(int64_t index, float* x, float* t) const;

  // The most bytes the vectors of one TrainMicroBatch held at once, the largest over the calls so far: the
  // samples and targets, the activations and their gradients, and the fp32 copies of the parameters in use
  // (ParamF32), counted by their allocator. What the model's spec predicts (MlpSpec's ActivationBytes).
  uint64_t activation_peak_bytes() const { return activation_peak_bytes_; }

  int input_unit() const { return input_; }
  int hidden_unit() const { return hidden_; }
  int output_unit() const { return output_; }

 private:
  MlpShape shape_;
  int input_ = -1, hidden_ = -1, output_ = -1;
  uint64_t activation_peak_bytes_ = 0;
};

}  // namespace strata::mlp
