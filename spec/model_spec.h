// The model interface: what the tools ask of one model at one size (docs/decisions/0035-model-interface.md).
// `strata plan` lays out its units with the engine's own accounting and times its schedule from its FLOPs;
// `strata bench capacity` grows it; `strata bench step` and `strata doctor --measure` time its host product;
// `strata doctor` sizes the pinned buffers of its units. A model family (spec/family.h) builds these from
// its flags. The GPT is one (models/gpt/spec/gpt_spec.h); the example MLP another (models/mlp/mlp_spec.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/base/dtype.h"
#include "runtime/device/timeline.h"
#include "runtime/shard/layout.h"

namespace strata::spec {

// One unit as the model registers it on the engine: its name and parameters, in registration order.
struct UnitSpec {
  std::string name;
  std::vector<shard::ParamSpec> params;
};

// One use of a unit in one micro-batch, in the order the trainer calls the engine's hooks.
struct UnitUse {
  int unit = 0;             // index into Units()
  double flops = 0;         // this use's forward FLOPs for the micro-batch (its backward: twice as many)
  bool recomputed = false;  // under activation checkpointing, its forward runs again inside its backward
  bool reduces = false;     // backward: the unit's gradient is complete after this use (its reduction starts)
};
struct StepUses {
  std::vector<UnitUse> forward, backward;
};

// Where the trainer's activations live and how it computes: what sizes its workspace.
struct ComputeTarget {
  bool gpu = false;
  DType param_dtype = DType::kF32;
};

// A model dimension as reported ("layers": 12). `bench capacity` tabulates the first two.
struct Dimension {
  std::string name;
  int64_t value = 0;
};

// The host matrix product the trainer spends its time in: [m, k] x [k, n].
struct Product {
  int m = 0, k = 0, n = 0;
};

// One direction `bench capacity` grows a model in (depth, or width): the size k of this model in it.
struct Growth {
  std::string what;  // what grows, as the search names it: "layers", "d_model"
  int64_t size = 1;  // this model's k
  int64_t max = 1;   // the largest k the model takes
};

class ModelSpec {
 public:
  virtual ~ModelSpec() = default;

  // What it is: the dimensions' own check, a sentence for people, a short shape, the dimensions as data.
  virtual absl::Status Validate() const = 0;
  virtual std::string Describe() const = 0;
  virtual std::string Shape() const = 0;
  virtual std::vector<Dimension> Dimensions() const = 0;
  virtual int64_t NumParams() const = 0;
  virtual int SequenceLength() const = 0;  // tokens per sequence (1 for a model of samples)

  // Memory: the units the trainer registers, in order; the bytes of its workspace for one micro-batch of
  // `micro_batch` sequences (activations and scratch) on `target`; the fp32 copy it keeps of the unit in use
  // with low-precision parameters (0 with fp32).
  virtual std::vector<UnitSpec> Units() const = 0;
  virtual uint64_t ActivationBytes(int micro_batch, bool checkpointing, const ComputeTarget& target) const = 0;
  virtual uint64_t UnitCopyBytes(DType param_dtype, size_t largest_unit_elems) const = 0;

  // Time: forward FLOPs per token (3x for a training step), the uses of one micro-batch, and the host
  // product with its rate (GFLOP/s of the trainer's own kernel, repeated for `seconds` on this thread).
  virtual double ForwardFlopsPerToken() const = 0;
  virtual StepUses Uses(int micro_batch) const = 0;
  virtual Product HostProduct(int micro_batch) const = 0;
  virtual double HostProductGflops(const Product& p, double seconds) const = 0;

  // Growth (`bench capacity`): in depth (width = false) or width; the model of size k in that direction.
  virtual Growth Grows(bool width) const = 0;
  virtual std::shared_ptr<const ModelSpec> Scaled(bool width, int64_t k) const = 0;
};

// A model's schedule against the hooks its trainer called, as the engine's timeline recorded them (the
// spans of stream "compute", kind "forward" or "backward", one per use, in the order of the calls) over
// whole micro-batches of `micro_batch` sequences: each must be Uses(micro_batch) in order, and a backward
// use `reduces` exactly when it is its unit's last backward use, after which the engine reduces the unit's
// gradient (docs/decisions/0002-schedule-recording-and-eval.md). `strata plan` times that schedule, so a spec
// that says otherwise is refused: the error names the first use that differs, the spec's and the trainer's.
absl::Status CheckUses(const ModelSpec& model, int micro_batch, const std::vector<device::Span>& spans);

}  // namespace strata::spec
