#include "runtime/checkpoint/manifest.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::checkpoint {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string ToJson(const Manifest& m) {
  ordered_json j;
  j["format"] = "strata-checkpoint";
  j["version"] = m.version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["param_dtype"] = m.param_dtype;
  j["optimizer"] = m.optimizer;
  j["loss_scale"] = m.loss_scale;
  j["clean_steps"] = m.clean_steps;
  auto units = ordered_json::array();
  for (const ManifestUnit& u : m.units) {
    auto params = ordered_json::array();
    for (const ManifestParam& p : u.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel},
                        {"weight_decay", p.weight_decay}});
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

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& path) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "' is not valid JSON"));
  }
  Manifest m;
  try {
    if (j.value("format", "") != "strata-checkpoint") {
      return absl::DataLossError(absl::StrCat("'", path, "' is not a strata checkpoint manifest"));
    }
    m.version = j.at("version").get<int>();
    if (m.version > kManifestVersion) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint manifest '", path, "' has format version ",
                                                        m.version, ", newer than this strata reads (",
                                                        kManifestVersion, "); upgrade strata to load it"));
    }
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.stage = j.at("stage").get<int>();
    m.param_dtype = j.at("param_dtype").get<std::string>();
    m.optimizer = j.at("optimizer").get<std::string>();
    m.loss_scale = j.at("loss_scale").get<float>();
    m.clean_steps = j.at("clean_steps").get<int>();
    for (const auto& u : j.at("units")) {
      ManifestUnit mu{u.at("name").get<std::string>(), {}};
      for (const auto& p : u.at("params")) {
        mu.params.push_back(ManifestParam{p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                                          p.at("offset").get<uint64_t>(), p.at("numel").get<uint64_t>(),
                                          p.at("weight_decay").get<bool>()});
      }
      m.units.push_back(std::move(mu));
    }
    for (const auto& s : j.at("shards")) {
      m.shards.push_back(ManifestShard{s.at("rank").get<int>(), s.at("file").get<std::string>(),
                                       s.at("bytes").get<uint64_t>(),
                                       static_cast<uint32_t>(std::stoul(s.at("crc32").get<std::string>(), nullptr, 16))});
    }
    m.trainer_json = j.contains("trainer") ? j["trainer"].dump() : "{}";
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "' is malformed: ", e.what()));
  }
  if (static_cast<int>(m.shards.size()) != m.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "' lists ", m.shards.size(),
                                            " shards for world size ", m.world_size));
  }
  return m;
}

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }

std::vector<std::string> CompleteSteps(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && fs::exists(e.path() / kManifestName)) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifestName)) return path;
  if (!fs::is_directory(path)) return absl::NotFoundError(absl::StrCat("checkpoint '", path, "' does not exist"));
  const std::vector<std::string> steps = CompleteSteps(path);
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrCat("no complete checkpoint under '", path,
                                            "' (a step directory is complete once its manifest.json exists)"));
  }
  return steps.back();
}

}  // namespace strata::checkpoint
