// The GPT as a model family (spec/family.h), named "gpt": `strata train`'s flags give its setup
// (train_options.h), its Compute is the device with the GPT's NN back-end (compute.h), and its Trainer is
// the trainer's bring-up and micro-batch loop (trainer.h). gpt_register.cc registers it as the default
// family, with `strata train` and `strata generate` (docs/decisions/0035-model-interface.md).
#pragma once

#include <memory>

#include "models/gpt/train/train_options.h"
#include "spec/family.h"

namespace strata::gpt {

std::unique_ptr<spec::Family> MakeFamily();
// The options behind a setup this family's ParseTrain made; nullptr for another family's.
const tools::TrainOptions* OptionsOf(const spec::TrainSetup& setup);

}  // namespace strata::gpt
