#include "runtime/checkpoint/manifest.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/json_input.h"
#include "runtime/optim/state_kind.h"

namespace strata::checkpoint {

using nlohmann::json;
using nlohmann::ordered_json;

std::vector<std::string> StateKinds(absl::string_view optimizer) {
  std::vector<std::string> names;
  for (optim::StateKind k : optim::StateKinds(optimizer == "adamw" ? optim::OptimizerType::kAdamW
                                                                   : optim::OptimizerType::kSgd)) {
    names.emplace_back(optim::StateKindName(k));
  }
  return names;
}

std::vector<std::string> StateKinds(absl::string_view optimizer, const ManifestParam& p) {
  if (p.frozen) return {std::string(optim::StateKindName(optim::StateKind::kMaster))};
  return StateKinds(optimizer);
}

absl::Status CheckTrainerState(absl::string_view trainer_json) {
  STRATA_RETURN_IF_ERROR(CheckJsonNesting(std::string_view(trainer_json.data(), trainer_json.size()), kMaxJsonDepth - 1,
                                          "the trainer state"));
  if (!json::accept(trainer_json.begin(), trainer_json.end())) {
    return absl::InvalidArgumentError("the trainer state is not a JSON document");
  }
  return absl::OkStatus();
}

std::string ToJson(const Manifest& m) {
  ordered_json j;
  j["format"] = "strata-checkpoint";
  j["version"] = m.version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  if (m.replicas != 1)
    j["replicas"] = m.replicas;  // written only with hybrid sharding: older manifests stay as they were
  j["stage"] = m.stage;
  j["param_dtype"] = m.param_dtype;
  j["optimizer"] = m.optimizer;
  j["loss_scale"] = m.loss_scale;
  j["clean_steps"] = m.clean_steps;
  if (m.loss_scale_hysteresis > 0) j["loss_scale_hysteresis"] = m.loss_scale_hysteresis;
  auto units = ordered_json::array();
  for (const ManifestUnit& u : m.units) {
    auto params = ordered_json::array();
    for (const ManifestParam& p : u.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel},
                        {"weight_decay", p.weight_decay}});
      if (p.frozen) params.back()["frozen"] = true;
      if (p.skipped_steps > 0) params.back()["skipped_steps"] = p.skipped_steps;
      if (p.own_lr) params.back()["own_lr"] = *p.own_lr;
      if (p.own_weight_decay) params.back()["own_weight_decay"] = *p.own_weight_decay;
    }
    units.push_back({{"name", u.name}, {"params", params}});
  }
  j["units"] = units;
  auto shards = ordered_json::array();
  for (const ManifestShard& s : m.shards) {
    shards.push_back({{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes},
                      {"crc32", absl::StrFormat("%08x", s.checksum)}});
  }
  j["shards"] = shards;
  j["trainer"] = ordered_json::parse(m.trainer_json, nullptr, false);
  return j.dump(1);
}

namespace {

// One parameter; `prev_end` is where the unit's previous parameter ends (parameters are packed in order).
absl::StatusOr<ManifestParam> ParseParam(const JsonReader& in, const json& p, const std::string& f,
                                         int version, uint64_t* prev_end) {
  STRATA_RETURN_IF_ERROR(in.IsObject(p, f));
  ManifestParam mp;
  STRATA_ASSIGN_OR_RETURN(mp.name, in.Str(p, "name", f + ".name"));
  if (mp.name.empty()) return in.Bad(f + ".name", "is empty");
  STRATA_ASSIGN_OR_RETURN(const json* shape, in.Array(p, "shape", f + ".shape"));
  uint64_t product = 1;
  for (size_t d = 0; d < shape->size(); ++d) {
    const json& dim = (*shape)[d];
    const bool negative = dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0;
    if (!dim.is_number_integer() || negative || (dim.is_number_unsigned() && dim.get<uint64_t>() > INT64_MAX)) {
      return in.Bad(Index(f + ".shape", d), "must be a non-negative 64-bit integer");
    }
    const int64_t x = dim.get<int64_t>();
    if (__builtin_mul_overflow(product, static_cast<uint64_t>(x), &product)) {
      return in.Bad(Index(f + ".shape", d), "makes the element count overflow 64 bits");
    }
    mp.shape.push_back(x);
  }
  STRATA_ASSIGN_OR_RETURN(mp.offset, in.Uint(p, "offset", f + ".offset"));
  STRATA_ASSIGN_OR_RETURN(mp.numel, in.Uint(p, "numel", f + ".numel"));
  if (mp.numel != product) {
    return in.Bad(f + ".numel", absl::StrCat("is ", mp.numel, " but its shape holds ", product, " elements"));
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(mp.offset, mp.numel, &end)) return in.Bad(f + ".offset", "+ numel overflows 64 bits");
  if (mp.offset < *prev_end) {
    return in.Bad(f + ".offset", absl::StrCat("is ", mp.offset, ", inside the previous parameter (which ends at ",
                                              *prev_end, ")"));
  }
  *prev_end = end;
  STRATA_ASSIGN_OR_RETURN(mp.weight_decay, in.Bool(p, "weight_decay", f + ".weight_decay"));
  if (p.contains("frozen")) {  // format 2; optional, false when absent
    if (version < kFrozenManifestVersion) {
      return in.Bad(f + ".frozen",
                    absl::StrCat("needs format version ", kFrozenManifestVersion, " (this is ", version, ")"));
    }
    STRATA_ASSIGN_OR_RETURN(mp.frozen, in.Bool(p, "frozen", f + ".frozen"));
  }
  if (p.contains("skipped_steps")) {  // format 3; optional, 0 when absent
    if (version < kSkippedManifestVersion) {
      return in.Bad(f + ".skipped_steps",
                    absl::StrCat("needs format version ", kSkippedManifestVersion, " (this is ", version, ")"));
    }
    uint64_t skipped = 0;
    STRATA_ASSIGN_OR_RETURN(skipped, in.Uint(p, "skipped_steps", f + ".skipped_steps"));
    if (skipped > static_cast<uint64_t>(INT64_MAX)) return in.Bad(f + ".skipped_steps", "is out of range");
    mp.skipped_steps = static_cast<int64_t>(skipped);
  }
  const std::pair<const char*, std::optional<double>*> own[] = {{"own_lr", &mp.own_lr},
                                                                {"own_weight_decay", &mp.own_weight_decay}};
  for (const auto& [key, value] : own) {
    if (!p.contains(key)) continue;  // format 4; optional, the config's when absent
    const std::string field = absl::StrCat(f, ".", key);
    if (version < kOwnHyperManifestVersion) {
      return in.Bad(field, absl::StrCat("needs format version ", kOwnHyperManifestVersion, " (this is ", version, ")"));
    }
    STRATA_ASSIGN_OR_RETURN(const double x, in.Number(p, key, field));
    if (x < 0) return in.Bad(field, absl::StrCat("is ", x, "; it must be >= 0"));
    *value = x;
  }
  if (mp.own_weight_decay && !mp.weight_decay) {
    return in.Bad(f + ".own_weight_decay", "is set on a parameter that does not decay (weight_decay false)");
  }
  return mp;
}

absl::Status ParseUnits(const JsonReader& in, const json& j, Manifest* m) {
  STRATA_ASSIGN_OR_RETURN(const json* units, in.Array(j, "units", "units"));
  std::set<std::string> names;
  for (size_t i = 0; i < units->size(); ++i) {
    const json& u = (*units)[i];
    const std::string f = Index("units", i);
    STRATA_RETURN_IF_ERROR(in.IsObject(u, f));
    ManifestUnit mu;
    STRATA_ASSIGN_OR_RETURN(mu.name, in.Str(u, "name", f + ".name"));
    if (mu.name.empty() || !names.insert(mu.name).second) return in.Bad(f + ".name", "is empty or repeated");
    STRATA_ASSIGN_OR_RETURN(const json* params, in.Array(u, "params", f + ".params"));
    std::set<std::string> param_names;
    uint64_t end = 0;
    for (size_t p = 0; p < params->size(); ++p) {
      const std::string pf = Index(f + ".params", p);
      STRATA_ASSIGN_OR_RETURN(ManifestParam mp, ParseParam(in, (*params)[p], pf, m->version, &end));
      if (!param_names.insert(mp.name).second) return in.Bad(pf + ".name", "repeats another parameter's name");
      mu.params.push_back(std::move(mp));
    }
    m->units.push_back(std::move(mu));
  }
  return absl::OkStatus();
}

absl::Status ParseShards(const JsonReader& in, const json& j, const std::string& path, Manifest* m) {
  STRATA_ASSIGN_OR_RETURN(const json* shards, in.Array(j, "shards", "shards"));
  if (shards->size() != static_cast<size_t>(m->world_size)) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "' lists ", shards->size(),
                                            " shards for world size ", m->world_size));
  }
  std::vector<bool> seen(m->world_size, false);
  std::set<std::string> files;
  for (size_t i = 0; i < shards->size(); ++i) {
    const json& s = (*shards)[i];
    const std::string f = Index("shards", i);
    STRATA_RETURN_IF_ERROR(in.IsObject(s, f));
    ManifestShard ms;
    STRATA_ASSIGN_OR_RETURN(const int64_t rank, in.Int(s, "rank", f + ".rank", 0, m->world_size - 1));
    if (seen[rank]) return in.Bad(f + ".rank", absl::StrCat("repeats rank ", rank, " (each rank has one shard)"));
    seen[rank] = true;
    ms.rank = static_cast<int>(rank);
    STRATA_ASSIGN_OR_RETURN(ms.file, in.Str(s, "file", f + ".file"));
    if (absl::Status st = CheckPlainFileName(ms.file); !st.ok()) {
      return in.Bad(f + ".file",
                    absl::StrCat("'", absl::CHexEscape(ms.file), "' is not a file inside the step directory: ",
                                 st.message()));
    }
    if (!files.insert(ms.file).second) {
      return in.Bad(f + ".file", absl::StrCat("'", absl::CHexEscape(ms.file), "' names another shard's file"));
    }
    STRATA_ASSIGN_OR_RETURN(ms.bytes, in.Uint(s, "bytes", f + ".bytes"));
    STRATA_ASSIGN_OR_RETURN(ms.checksum, in.Hex32(s, "crc32", f + ".crc32"));
    m->shards.push_back(std::move(ms));
  }
  std::sort(m->shards.begin(), m->shards.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return absl::OkStatus();
}

// The state the parameters need (fp32, every kind) must fit in the bytes the shards declare; their real
// sizes are checked against those when each shard is opened.
absl::Status CheckSizes(const JsonReader& in, const Manifest& m) {
  uint64_t need = 0, have = 0;
  for (size_t u = 0; u < m.units.size(); ++u) {
    for (size_t p = 0; p < m.units[u].params.size(); ++p) {
      const uint64_t kinds = StateKinds(m.optimizer, m.units[u].params[p]).size();
      uint64_t bytes = 0;
      if (__builtin_mul_overflow(m.units[u].params[p].numel, 4 * kinds, &bytes) ||
          __builtin_add_overflow(need, bytes, &need)) {
        return in.Bad(Index(Index("units", u) + ".params", p) + ".numel", "makes the state size overflow 64 bits");
      }
    }
  }
  for (const ManifestShard& s : m.shards) {
    if (__builtin_add_overflow(have, s.bytes, &have)) return in.Bad("shards", "bytes add up past 64 bits");
  }
  if (need > have) {
    return in.Bad("units", absl::StrCat("need ", need, " bytes of ", m.optimizer, " state, but the shards hold only ",
                                        have, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ParseScalars(const JsonReader& in, const json& j, const std::string& path, Manifest* m) {
  STRATA_ASSIGN_OR_RETURN(const int64_t version, in.Int(j, "version", "version", 1, INT_MAX));
  m->version = static_cast<int>(version);
  if (m->version > kManifestVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint manifest '", path, "' has format version ",
                                                      m->version, ", newer than this strata reads (",
                                                      kManifestVersion, "); upgrade strata to load it"));
  }
  STRATA_ASSIGN_OR_RETURN(m->step, in.Int(j, "step", "step", 0, INT64_MAX));
  STRATA_ASSIGN_OR_RETURN(const int64_t world, in.Int(j, "world_size", "world_size", 1, kMaxWorldSize));
  m->world_size = static_cast<int>(world);
  if (j.contains("replicas")) {
    STRATA_ASSIGN_OR_RETURN(const int64_t replicas, in.Int(j, "replicas", "replicas", 1, kMaxWorldSize / world));
    m->replicas = static_cast<int>(replicas);
  }
  STRATA_ASSIGN_OR_RETURN(const int64_t stage, in.Int(j, "stage", "stage", 0, 3));
  m->stage = static_cast<int>(stage);
  STRATA_ASSIGN_OR_RETURN(m->param_dtype, in.Str(j, "param_dtype", "param_dtype"));
  if (m->param_dtype != "fp32" && m->param_dtype != "bf16" && m->param_dtype != "fp16") {
    return in.Bad("param_dtype", absl::StrCat("is '", m->param_dtype, "'; expected fp32, bf16 or fp16"));
  }
  STRATA_ASSIGN_OR_RETURN(m->optimizer, in.Str(j, "optimizer", "optimizer"));
  if (m->optimizer != "adamw" && m->optimizer != "sgd") {
    return in.Bad("optimizer", absl::StrCat("is '", m->optimizer, "'; expected adamw or sgd"));
  }
  STRATA_ASSIGN_OR_RETURN(const double scale, in.Number(j, "loss_scale", "loss_scale"));
  if (!(scale > 0) || scale > FLT_MAX) return in.Bad("loss_scale", "must be a positive float");
  m->loss_scale = static_cast<float>(scale);
  STRATA_ASSIGN_OR_RETURN(const int64_t clean, in.Int(j, "clean_steps", "clean_steps", 0, INT_MAX));
  m->clean_steps = static_cast<int>(clean);
  if (j.contains("loss_scale_hysteresis")) {
    STRATA_ASSIGN_OR_RETURN(const int64_t left,
                            in.Int(j, "loss_scale_hysteresis", "loss_scale_hysteresis", 1, INT_MAX));
    m->loss_scale_hysteresis = static_cast<int>(left);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view path_view) {
  const std::string path(path_view);
  const std::string what = absl::StrCat("checkpoint manifest '", path, "'");
  auto parsed = ParseUntrustedJson(text, what);
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  const json& j = *parsed;
  const auto format = j.is_object() ? j.find("format") : j.end();
  if (!j.is_object() || format == j.end() || !format->is_string() || *format != "strata-checkpoint") {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a strata checkpoint manifest"));
  }
  const JsonReader in(what);
  Manifest m;
  STRATA_RETURN_IF_ERROR(ParseScalars(in, j, path, &m));
  STRATA_RETURN_IF_ERROR(ParseUnits(in, j, &m));
  STRATA_RETURN_IF_ERROR(ParseShards(in, j, path, &m));
  STRATA_RETURN_IF_ERROR(CheckSizes(in, m));
  const auto trainer = j.find("trainer");
  m.trainer_json = trainer == j.end() ? "{}" : trainer->dump(-1, ' ', false, json::error_handler_t::replace);
  return m;
}

}  // namespace strata::checkpoint
