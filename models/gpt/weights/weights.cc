#include "models/gpt/weights/weights.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/engine/pretrained_load.h"

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

// The writer's part of SaveWeights: each parameter gathered and handed to the file in turn, one in memory at a
// time. `gathered` counts the parameters whose gather was started, so the caller finishes the rest.
absl::Status WriteGathered(const std::string& path, std::vector<checkpoint::TensorToWrite> tensors,
                           const std::map<std::string, std::string>& metadata, const std::vector<HfParam>& params,
                           UnitGatherer& gather, size_t* gathered) {
  STRATA_ASSIGN_OR_RETURN(checkpoint::SafetensorsWriter writer,
                          checkpoint::SafetensorsWriter::Begin(path, std::move(tensors), metadata));
  for (const HfParam& p : params) {
    ++*gathered;
    STRATA_ASSIGN_OR_RETURN(const std::vector<float> values, gather.Param(p));
    STRATA_RETURN_IF_ERROR(writer.WriteTensor(values));
  }
  return writer.Finish();
}

}  // namespace

absl::Status SaveWeights(engine::Engine& e, const GptModel& model, const std::string& path, bool write) {
  const auto& params = model.hf_params();
  UnitGatherer gather(e);
  size_t gathered = 0;
  absl::Status status;
  if (write) {
    std::vector<checkpoint::TensorToWrite> tensors;
    for (const HfParam& p : params) tensors.push_back({p.name, p.shape});
    const GptConfig& c = model.config();
    status = WriteGathered(path, tensors,
                           {{"format", "pt"},
                            {"producer", "strata"},
                            {"n_layer", absl::StrCat(c.layers)},
                            {"n_embd", absl::StrCat(c.d_model)},
                            {"n_head", absl::StrCat(c.heads)},
                            {"n_positions", absl::StrCat(c.seq_len)},
                            {"vocab_size", absl::StrCat(c.vocab)}},
                           params, gather, &gathered);
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
  // A .safetensors file or a Hugging Face directory (an index and its shards), validated as untrusted input;
  // each rank then reads only the byte ranges of the elements it keeps (Note [Pretrained by byte ranges]).
  STRATA_ASSIGN_OR_RETURN(const auto c, checkpoint::PretrainedCheckpoint::Open(path));
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < c->tensors().size(); ++i) {
    const std::string& name = c->tensors()[i].info.name;
    // "wte.weight" and "transformer.wte.weight" name one parameter: a file with both is ambiguous.
    auto [it, inserted] = by_name.emplace(Strip(name), i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("weights file '", path, "' holds both '",
                                                     c->tensors()[it->second].info.name, "' and '", name,
                                                     "', which name the same parameter '", it->first, "': keep one"));
    }
  }
  std::set<std::string> used;
  std::vector<engine::PretrainedTarget> targets;
  for (const HfParam& p : model.hf_params()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("weights file '", path, "' has no tensor '", p.name,
                                              "' (the model ", Describe(model.config()), " needs it)"));
    }
    const checkpoint::TensorInfo& t = c->tensors()[it->second].info;
    if (t.shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights file '", path, "': tensor '", p.name, "' has shape [", absl::StrJoin(t.shape, ","),
                       "] but the model needs [", absl::StrJoin(p.shape, ","), "] (", Describe(model.config()), ")"));
    }
    targets.push_back(engine::PretrainedTarget{p.unit, p.param, it->second});
    used.insert(p.name);
  }
  for (const auto& [name, index] : by_name) {
    if (!used.count(name) && !Ignorable(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights file '", path, "' has tensor '", c->tensors()[index].info.name,
                       "', which is not a parameter of GPT-2 with ", Describe(model.config())));
    }
  }
  // A NaN or Inf would surface steps later as "training diverged", or as garbage from generate: refused, naming
  // the tensor and the index (engine::LoadPretrained).
  STRATA_ASSIGN_OR_RETURN(const checkpoint::RangeReadStats stats, engine::LoadPretrained(e, *c, targets, {}));
  STRATA_LOG(Info) << "loaded '" << path << "': " << stats.bytes_read << " bytes read by this rank in " << stats.seconds
                   << " s (" << stats.backend << (stats.registered ? ", registered buffers" : "") << ")";
  return absl::OkStatus();
}

}  // namespace strata::gpt
