// The MLP (mlp_model.h) behind the model interface (spec/model_spec.h, spec/family.h): the second model
// family, "mlp", beside the GPT, so that `strata plan`, `bench` and `doctor` are shown to take any model
// that implements the interface. The `strata` executable registers it (mlp_register.cc; --model-family mlp),
// and so does tests/tools/plan/plan_any_model_test.cc. Its flags: --in --hidden --out (the shape), and the
// engine's --stage --micro-batch --grad-accum --param-dtype --offload-optimizer --offload-params --nvme-path
// --device-budget --host-budget --steps. A micro-batch is `micro` samples; a sample is one "token"
// (SequenceLength 1). It runs on the host only.
#pragma once

#include <memory>

#include "models/mlp/mlp_model.h"
#include "spec/family.h"
#include "spec/model_spec.h"

namespace strata::mlp {

std::shared_ptr<const spec::ModelSpec> MlpSpec(const MlpShape& shape);
std::unique_ptr<spec::Family> MakeMlpFamily();

}  // namespace strata::mlp
