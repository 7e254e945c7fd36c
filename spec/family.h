// A model family: a registered kind of model (spec/registry.h) and what the tools run of it. Its trainer's
// flags give a TrainSetup (the model at its size, the engine's config, the device asked for); the setup
// starts the device with the family's back-end (Compute), and the family brings the model up on an engine
// as a Trainer, which `strata bench` runs on synthetic tokens. docs/decisions/0035-model-interface.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine.h"
#include "spec/flags.h"
#include "spec/model_spec.h"

namespace strata::spec {

// A name and a value a command reports ("attention": "fused"), in the order given.
using Facts = std::vector<std::pair<std::string, std::string>>;

// The device a job computes on and the family's back-end for it, which the tools only hand back to the
// family (Family::BringUp).
class Compute {
 public:
  virtual ~Compute() = default;
  virtual device::Device& device() = 0;
  virtual bool gpu() const = 0;
  virtual std::string name() const = 0;  // "host", "cuda:0"
  // The GPU's dense bf16 matrix-product rate, measured now (FLOP/s): `bench step`'s MFU denominator.
  virtual absl::StatusOr<double> Bf16MatmulFlops() = 0;
};

// A model registered on an engine and finalized, as `strata bench` runs it.
class Trainer {
 public:
  virtual ~Trainer() = default;
  virtual engine::Engine& engine() = 0;
  // The tokens of `micro` sequences drawn once from std::mt19937(seed) (inputs = targets), for every
  // later RunMicroBatches.
  virtual void SynthesizeTokens(uint32_t seed, int micro) = 0;
  // One step's `count` micro-batches on them through the engine's micro-batch protocol, each at the
  // engine's loss scale; the step's mean loss. Step() is the caller's.
  virtual absl::StatusOr<double> RunMicroBatches(int count, bool checkpointing) = 0;
  // How it computes, for reports ("matmul": "bf16", "attention": "fused").
  virtual Facts facts() const = 0;
  // The bytes its workspace (activations and scratch) held for the micro-batches it ran, measured: what
  // ModelSpec::ActivationBytes predicts for them (tests/spec/family_conformance_test.cc holds the two equal).
  virtual uint64_t activation_bytes() const = 0;
};

// What a family's trainer flags say, as the tools read them.
class TrainSetup {
 public:
  virtual ~TrainSetup() = default;
  std::shared_ptr<const ModelSpec> model;
  engine::EngineConfig engine;
  bool checkpointing = false;
  int64_t steps = 0;
  // The kind of device the setup asks for, as this machine reads it ("auto": a GPU when one is visible).
  virtual device::DeviceKind device_kind() const = 0;
  // The device and the back-end; under torchrun on a GPU that of `local_rank`. An error names the reason.
  virtual absl::StatusOr<std::unique_ptr<Compute>> MakeCompute(std::optional<int> local_rank) const = 0;
};

class Family {
 public:
  virtual ~Family() = default;
  virtual std::string name() const = 0;
  // Its trainer's flags (the model, the config and its overrides, the run): `strata train`'s for the GPT.
  virtual std::vector<FlagDef> TrainFlagDefs() const = 0;
  virtual absl::StatusOr<std::unique_ptr<TrainSetup>> ParseTrain(const std::vector<std::string>& args,
                                                                 int world_size) const = 0;
  // Creates the engine on `dev` over `world`, registers `model` on it and finalizes it. `compute`: the
  // setup's Compute, whose back-end the trainer takes (nullptr: the host kernels). Finalize's error comes
  // back as it is: ResourceExhausted when the model does not fit the budgets.
  virtual absl::StatusOr<std::unique_ptr<Trainer>> BringUp(const ModelSpec& model, const engine::EngineConfig& config,
                                                           comm::Communicator& world, device::Device& dev,
                                                           Compute* compute) const = 0;
  // Checkpoints whose trainer state names `checkpoint_kind()` as its "model_kind" are this family's;
  // `strata ckpt export` names their tensors ExportName(unit, param), `export_names()` saying which names.
  virtual std::string checkpoint_kind() const { return ""; }
  virtual std::string ExportName(const std::string& unit, const std::string& param) const { return unit + "." + param; }
  virtual std::string export_names() const { return ""; }
};

}  // namespace strata::spec
