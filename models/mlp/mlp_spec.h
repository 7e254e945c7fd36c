// The example MLP (mlp_model.h) behind the model interface (spec/model_spec.h, spec/family.h): a second
// model family, "mlp", beside the GPT, so that `strata plan`, `bench` and `doctor` are shown to take any
// model that implements the interface (tests/tools/plan/plan_any_model_test.cc registers it). Its flags:
// --in --hidden --out (the shape), and the engine's --stage --micro-batch --grad-accum --param-dtype
// --offload-optimizer --offload-params --nvme-path --steps. A micro-batch is `micro` samples; a sample is one
// "token" (SequenceLength 1).
#pragma once

#include <memory>

#include "models/mlp/mlp_model.h"
#include "spec/family.h"
#include "spec/model_spec.h"

namespace strata::mlp {

std::shared_ptr<const spec::ModelSpec> MlpSpec(const MlpShape& shape);
std::unique_ptr<spec::Family> MakeMlpFamily();

}  // namespace strata::mlp
