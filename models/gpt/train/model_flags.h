// Flags shared by the commands that build a GPT: --model and the shape overrides.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/model/gpt_config.h"
#include "spec/flags.h"

namespace strata::tools {

std::vector<spec::FlagDef> ModelFlagDefs();
// --model PRESET (default gpt2-tiny), then --layers --d-model --heads --seq-len --vocab override it.
absl::StatusOr<gpt::GptConfig> ModelFromFlags(const spec::Flags& f);

}  // namespace strata::tools
