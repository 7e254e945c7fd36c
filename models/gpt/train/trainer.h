// The GPT trainer's core, shared by `strata train`, `strata bench step` and `strata bench capacity`: one
// bring-up (the engine, the model registered on it, Finalize) and one micro-batch loop (the engine's
// BeginMicroBatch / TrainMicroBatch / EndMicroBatch protocol, once per micro-batch of a step). What the
// commands add around them (data, metrics, checkpoints, timing, the capacity search) stays theirs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "models/gpt/model/gpt_config.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/model/nn_backend.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine.h"

namespace strata::tools {

// An engine with the GPT registered on it and finalized.
struct GptRun {
  std::unique_ptr<engine::Engine> engine;
  gpt::GptModel model;
};

// Creates the engine on `dev` over `world`, registers `model` on it (`nn`: its back-end, nullptr for the
// host kernels) and finalizes it. Finalize's error comes back as it is: ResourceExhausted when the model
// does not fit the budgets, which `bench capacity` reads as "too large", not as a failure.
absl::StatusOr<GptRun> BringUp(const engine::EngineConfig& config, const gpt::GptConfig& model,
                               comm::Communicator& world, device::Device& dev,
                               std::unique_ptr<gpt::NnBackend> nn = nullptr);

// One micro-batch's B x T inputs and targets (valid until the next call of `next`) and its loss scale.
struct MicroBatchInput {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  float loss_scale = 1;
};

// The micro-batches of one step: for a = 0 .. count-1, `next(a)` supplies the a-th micro-batch of `micro`
// sequences, which runs through the engine's micro-batch protocol. Returns the step's mean loss, each
// micro-batch's loss divided by `count` and summed in order (the same bits on every rank and run). The
// first error stops it and comes back as it is (gpt::IsDivergence still tells divergence). Step() is
// the caller's: the commands time it, and act on its result, differently.
absl::StatusOr<double> RunMicroBatches(GptRun& run, int count, int micro, bool checkpointing,
                                       const std::function<absl::StatusOr<MicroBatchInput>(int)>& next);

}  // namespace strata::tools
