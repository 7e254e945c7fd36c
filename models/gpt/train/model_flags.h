// Flags shared by the commands that build a GPT: --model and the shape overrides.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/model/gpt_config.h"
#include "tools/cli/flags.h"

namespace strata::tools {

std::vector<FlagDef> ModelFlagDefs();
// --model PRESET (default gpt2-tiny), then --layers --d-model --heads --seq-len --vocab override it.
absl::StatusOr<gpt::GptConfig> ModelFromFlags(const Flags& f);

}  // namespace strata::tools
