// DeepSpeed keys the config schema does not read (config.cc), and what Strata says about each; the "auto"
// values Hugging Face's integration fills in; and the batch-size triangle. Internal to the config parser
// (config.cc) and Engine::Create; docs/decisions/0028-deepspeed-config-semantics.md.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "runtime/engine/config.h"

namespace strata::engine::deepspeed {

// Note [DeepSpeed keys Strata does not read]
// A DeepSpeed key outside the schema is one of three kinds. kNoEffect: it tunes DeepSpeed's own buckets,
// monitors or logging, which Strata does differently (per-unit gathers on their own streams, its own
// metrics); accepted, and listed once in a note. kEquivalent: Strata has the same thing under another key
// or option; refused, naming it. kMissing: a DeepSpeed feature Strata does not have; refused, saying what
// to do. Either of the last two is accepted as kNoEffect is when its value is the one that asks for nothing
// (off_value: DeepSpeed's default, e.g. "zero_quantized_weights": false).
enum class KeyKind { kNoEffect, kEquivalent, kMissing };

struct KeyInfo {
  const char* path;        // the full key path, e.g. "zero_optimization.overlap_comm"
  KeyKind kind;
  const char* advice;      // kEquivalent: the Strata key or option; kMissing: what to do instead
  const char* off_value;   // kMissing: the JSON text of the value that asks for nothing (nullptr: none)
};

// The entry for `path`, or nullptr. A path under a listed one (a monitor's sub-keys) finds its parent.
const KeyInfo* FindKey(const std::string& path);

// Whether a block outside the schema holds listed keys ("data_types"): its keys are then judged one by one.
bool HasKeysUnder(const std::string& path);

// The problem (InvalidArgument text) or the no-effect note for a DeepSpeed key outside the schema with
// value `v`: exactly one of *problem / *no_effect is set when FindKey(path) is not null.
void Judge(const KeyInfo& key, const std::string& path, const nlohmann::json& v, std::string* problem,
           bool* no_effect);

// Note ["auto"]. Replaces the "auto" values of `doc` the way Hugging Face's HfTrainerDeepSpeedConfig does,
// from what the front end knows (`facts`): the batch keys and the optimizer's values become absent (the
// batch triangle derives them, the optimizer's defaults or the flags give the rest), gradient_clipping 1.0
// (TrainingArguments.max_grad_norm's default, which Hugging Face fills in), warmup_min_lr 0,
// warmup_max_lr the optimizer's lr, total_num_steps facts.total_steps, the ZeRO bucket sizes from
// facts.hidden_size (hidden^2, 0.9 hidden^2, 10 hidden). One that cannot be resolved is a problem naming the
// key and what to set, as (key path, message), and the key is removed. *resolved gets each resolved key's
// path, with " = value" where the value is already known (EngineConfig::auto_resolved).
void ResolveAuto(const ConfigFacts& facts, nlohmann::json* doc,
                 std::vector<std::pair<std::string, std::string>>* problems, std::vector<std::string>* resolved);

}  // namespace strata::engine::deepspeed
