// Fuzzes the checkpoint manifest parser (runtime/checkpoint/manifest.cc): manifest.json text from an
// untrusted step directory. Properties beyond "no crash, leak or UB":
//  - a rejection is DataLoss or FailedPrecondition (the header's contract), with a message naming the file;
//  - an accepted manifest names each shard file inside its step directory (a plain relative name: no
//    "..", no absolute path), since the loaders join it to the directory (docs/design.md
//    "External input is hostile until validated": file names confined to their directory);
//  - every accepted number is the document's number exactly (no silent narrowing: json_exact.h), and each
//    CRC-32 is the value of its hex text;
//  - an accepted manifest survives ToJson -> ParseManifest unchanged (a checkpoint re-saved after loading
//    it must load again).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/checkpoint/manifest.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/json_exact.h"

namespace {

using strata::checkpoint::Manifest;

constexpr char kPath[] = "fuzz/step_00000001/manifest.json";

bool ConfinedName(const std::string& file) {
  const std::filesystem::path p(file);
  if (file.empty() || p.is_absolute() || p.has_root_name()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

bool SameManifest(const Manifest& a, const Manifest& b) {
  if (a.version != b.version || a.step != b.step || a.world_size != b.world_size || a.stage != b.stage ||
      a.param_dtype != b.param_dtype || a.optimizer != b.optimizer || a.clean_steps != b.clean_steps ||
      a.units.size() != b.units.size() || a.shards.size() != b.shards.size() || a.trainer_json != b.trainer_json) {
    return false;
  }
  if (!(a.loss_scale == b.loss_scale) && !(a.loss_scale != a.loss_scale && b.loss_scale != b.loss_scale)) return false;
  for (size_t u = 0; u < a.units.size(); ++u) {
    const auto& ua = a.units[u];
    const auto& ub = b.units[u];
    if (ua.name != ub.name || ua.params.size() != ub.params.size()) return false;
    for (size_t p = 0; p < ua.params.size(); ++p) {
      const auto& pa = ua.params[p];
      const auto& pb = ub.params[p];
      if (pa.name != pb.name || pa.shape != pb.shape || pa.offset != pb.offset || pa.numel != pb.numel ||
          pa.weight_decay != pb.weight_decay) {
        return false;
      }
    }
  }
  for (size_t s = 0; s < a.shards.size(); ++s) {
    const auto& sa = a.shards[s];
    const auto& sb = b.shards[s];
    if (sa.rank != sb.rank || sa.file != sb.file || sa.bytes != sb.bytes || sa.checksum != sb.checksum) return false;
  }
  return true;
}

// The parser walks "units" and "params" with range-for, so the raw document is walked the same way.
void ExpectExactNumbers(const std::string& text, const Manifest& m) {
  using strata::fuzz::ExpectExact;
  const auto j = nlohmann::json::parse(text);
  ExpectExact(j, "version", m.version, "manifest");
  ExpectExact(j, "step", m.step, "manifest");
  ExpectExact(j, "world_size", m.world_size, "manifest");
  ExpectExact(j, "stage", m.stage, "manifest");
  ExpectExact(j, "clean_steps", m.clean_steps, "manifest");
  size_t u = 0;
  for (const auto& ju : j.at("units")) {
    size_t p = 0;
    for (const auto& jp : ju.at("params")) {
      const auto& param = m.units.at(u).params.at(p++);
      const std::string what = "units[" + std::to_string(u) + "].params[" + std::to_string(p - 1) + "]";
      ExpectExact(jp, "offset", param.offset, what);
      ExpectExact(jp, "numel", param.numel, what);
      size_t d = 0;
      for (const auto& jd : jp.at("shape")) {
        STRATA_FUZZ_EXPECT(strata::fuzz::SameNumber(jd, param.shape.at(d)), "accepted %s.shape[%zu] = %lld from %s",
                           what.c_str(), d, static_cast<long long>(param.shape.at(d)),
                           jd.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        ++d;
      }
    }
    ++u;
  }
  // ParseManifest orders the shards by rank (a manifest may list them in any order): the document's, in
  // the order of their rank numbers, are compared with them one for one.
  std::vector<nlohmann::json> doc_shards(j.at("shards").begin(), j.at("shards").end());
  std::stable_sort(doc_shards.begin(), doc_shards.end(),
                   [](const nlohmann::json& a, const nlohmann::json& b) { return a.at("rank") < b.at("rank"); });
  size_t s = 0;
  for (const auto& js : doc_shards) {
    const auto& shard = m.shards.at(s);
    const std::string what = "shards[" + std::to_string(s++) + "]";
    ExpectExact(js, "rank", shard.rank, what);
    ExpectExact(js, "bytes", shard.bytes, what);
    strata::fuzz::ExpectExactHex32(js, "crc32", shard.checksum, what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Manifest> m = strata::checkpoint::ParseManifest(text, kPath);
  if (!m.ok()) {
    const absl::StatusCode code = m.status().code();
    STRATA_FUZZ_EXPECT(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition,
                       "unexpected error kind: %s", m.status().ToString().c_str());
    STRATA_FUZZ_EXPECT(m.status().message().find(kPath) != absl::string_view::npos,
                       "error does not name the file: %s", m.status().ToString().c_str());
    return 0;
  }
  ExpectExactNumbers(text, *m);
  for (const auto& s : m->shards) {
    STRATA_FUZZ_EXPECT(ConfinedName(s.file), "accepted shard file name '%s' escapes the step directory",
                       s.file.c_str());
  }
  absl::StatusOr<Manifest> again = strata::checkpoint::ParseManifest(strata::checkpoint::ToJson(*m), kPath);
  STRATA_FUZZ_EXPECT(again.ok(), "an accepted manifest, written back, is rejected: %s",
                     again.status().ToString().c_str());
  STRATA_FUZZ_EXPECT(SameManifest(*m, *again), "an accepted manifest changes when written back and re-read");
  return 0;
}
