// Consolidated GPT-2 weights as safetensors with Hugging Face GPT-2 names and layouts: `wte.weight`,
// `wpe.weight`, `h.{i}.ln_1.weight`, `h.{i}.attn.c_attn.weight` stored [in, out] as transformers' Conv1D
// does, ..., `ln_f.weight`. A file written by transformers (with or without the "transformer." prefix)
// loads here, and ours loads in transformers.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "models/gpt/model/gpt_model.h"
#include "runtime/engine/engine.h"

namespace strata::gpt {

// Collective: every rank calls it; `write` is true on exactly one rank, which writes `path`. On a write
// failure the writer still takes part in every gather, so no rank is left waiting.
absl::Status SaveWeights(engine::Engine& e, const GptModel& model, const std::string& path, bool write);

// Every rank opens `path` (a .safetensors file, or a Hugging Face checkpoint directory: model.safetensors, or an
// index and its shards) and sets the parameters, reading only the byte ranges of the elements it keeps
// (engine::LoadPretrained; Note [Pretrained by byte ranges]). Errors name the file and the tensor: a missing or
// unexpected tensor, a wrong shape, a dtype that cannot be read, a truncated file, a value that is not finite.
// Not collective: a value or read error may strike one rank only, so a caller with several ranks agrees on the
// outcome (comm::AgreeOnOutcome) before its next collective.
absl::Status LoadWeights(engine::Engine& e, const GptModel& model, const std::string& path);

}  // namespace strata::gpt
