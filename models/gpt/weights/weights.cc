#include "models/gpt/weights/weights.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/safetensors.h"

namespace strata::gpt {
namespace {

// Buffers transformers keeps in GPT-2 checkpoints that are not parameters, and the tied LM head.
bool Ignorable(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string suffix(s);
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || name == "lm_head.weight";
}

std::string Strip(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

// The tensors of one unit, sliced from one gather of the unit (HfParams come unit by unit).
class UnitGatherer {
 public:
  explicit UnitGatherer(engine::Engine& e) : e_(e) {}
  absl::StatusOr<std::vector<float>> Param(const HfParam& p) {
    if (p.unit != unit_) {
      STRATA_ASSIGN_OR_RETURN(full_, e_.GatherUnit(p.unit));
      unit_ = p.unit;
    }
    const shard::ParamSlot& slot = e_.layout(p.unit).params[p.param];
    return std::vector<float>(full_.begin() + slot.offset_elems, full_.begin() + slot.offset_elems + slot.numel);
  }

 private:
  engine::Engine& e_;
  int unit_ = -1;
  std::vector<float> full_;
};

}  // namespace

absl::Status SaveWeights(engine::Engine& e, const GptModel& model, const std::string& path, bool write) {
  const auto& params = model.hf_params();
  UnitGatherer gather(e);
  size_t gathered = 0;
  absl::Status status;
  if (write) {
    std::vector<checkpoint::TensorToWrite> tensors;
    for (const HfParam& p : params) {
      tensors.push_back({p.name, p.shape, [&gather, &p, &gathered]() {
                           ++gathered;
                           return gather.Param(p);
                         }});
    }
    const GptConfig& c = model.config();
    status = checkpoint::WriteSafetensors(
        path, tensors,
        {{"format", "pt"}, {"producer", "strata"}, {"n_layer", absl::StrCat(c.layers)},
         {"n_embd", absl::StrCat(c.d_model)}, {"n_head", absl::StrCat(c.heads)},
         {"n_positions", absl::StrCat(c.seq_len)}, {"vocab_size", absl::StrCat(c.vocab)}});
  }
  // Non-writers, and a writer that stopped early, take part in the remaining gathers (the same units in
  // the same order, so every rank issues the same collectives).
  for (size_t i = gathered; i < params.size(); ++i) {
    auto v = gather.Param(params[i]);
    if (!v.ok() && status.ok()) status = v.status();
  }
  return status;
}

absl::Status LoadWeights(engine::Engine& e, const GptModel& model, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(checkpoint::SafetensorsReader r, checkpoint::SafetensorsReader::Open(path));
  std::map<std::string, const checkpoint::TensorInfo*> by_name;
  for (const auto& t : r.tensors()) {
    // "wte.weight" and "transformer.wte.weight" name one parameter: a file with both is ambiguous.
    auto [it, inserted] = by_name.emplace(Strip(t.name), &t);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("weights file '", path, "' holds both '", it->second->name,
                                                     "' and '", t.name, "', which name the same parameter '",
                                                     it->first, "': keep one"));
    }
  }
  std::set<std::string> used;
  for (const HfParam& p : model.hf_params()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("weights file '", path, "' has no tensor '", p.name,
                                              "' (the model ", Describe(model.config()), " needs it)"));
    }
    const checkpoint::TensorInfo& t = *it->second;
    if (t.shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights file '", path, "': tensor '", p.name, "' has shape [", absl::StrJoin(t.shape, ","),
                       "] but the model needs [", absl::StrJoin(p.shape, ","), "] (", Describe(model.config()), ")"));
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> v, r.ReadF32(t));
    // A NaN or Inf would surface steps later as "training diverged", or as garbage from generate.
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        return absl::InvalidArgumentError(absl::StrCat("weights file '", path, "': tensor '", t.name, "' holds ", v[i],
                                                       " at index ", i, "; weights must be finite"));
      }
    }
    STRATA_RETURN_IF_ERROR(e.SetParam(p.unit, p.param, v));
    used.insert(p.name);
  }
  for (const auto& [name, t] : by_name) {
    if (!used.count(name) && !Ignorable(name)) {
      return absl::InvalidArgumentError(absl::StrCat("weights file '", path, "' has tensor '", t->name,
                                                     "', which is not a parameter of GPT-2 with ",
                                                     Describe(model.config())));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::gpt
