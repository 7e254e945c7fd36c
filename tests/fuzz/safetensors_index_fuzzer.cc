// Fuzzes the safetensors index parser (runtime/checkpoint/pretrained.cc ParseSafetensorsIndex): the
// model.safetensors.index.json of an untrusted checkpoint directory (engine.load_pretrained,
// strata_safetensors_open, `strata train --init-from DIR`). The input is the index text. Properties beyond
// "no crash, leak or UB":
//  - a rejection is DataLoss naming the index's path;
//  - an accepted map is not empty, and is the document's "weight_map" exactly: the same tensor names, each with
//    its file name (strings compared byte for byte);
//  - every accepted file name is one plain path component (CheckPlainFileName: no '/', no "." or "..", no control
//    byte), so no index can make the loader open a file outside the checkpoint directory.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/pretrained.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = "/ckpt/model.safetensors.index.json";
  auto map = strata::checkpoint::ParseSafetensorsIndex(text, path);
  if (!map.ok()) {
    const absl::Status& s = map.status();
    STRATA_FUZZ_EXPECT(s.code() == absl::StatusCode::kDataLoss, "unexpected error kind: %s", s.ToString().c_str());
    STRATA_FUZZ_EXPECT(s.message().find(path) != absl::string_view::npos, "error does not name the index: %s",
                       s.ToString().c_str());
    return 0;
  }
  STRATA_FUZZ_EXPECT(!map->empty(), "accepted an empty weight_map");
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  STRATA_FUZZ_EXPECT(!j.is_discarded() && j.is_object() && j.contains("weight_map"),
                     "accepted a document nlohmann does not read as an object with a weight_map");
  const auto& wm = j.at("weight_map");
  STRATA_FUZZ_EXPECT(wm.size() == map->size(), "accepted %zu entries of a weight_map of %zu", map->size(),
                     static_cast<size_t>(wm.size()));
  for (const auto& [tensor, file] : *map) {
    STRATA_FUZZ_EXPECT(wm.contains(tensor) && wm.at(tensor).is_string() && wm.at(tensor).get<std::string>() == file,
                       "tensor '%s' -> '%s' is not the document's", tensor.c_str(), file.c_str());
    STRATA_FUZZ_EXPECT(strata::checkpoint::CheckPlainFileName(file).ok(), "accepted file name '%s' is not plain",
                       file.c_str());
  }
  return 0;
}
