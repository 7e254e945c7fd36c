// A two-rank AdamW checkpoint written by the checkpoint library alone (no engine): unit "u" with
// parameters w [2,5] (elements 0-9) and b [3] (elements 12-14), 8 elements per rank. Element i of kind k
// holds i + 100 k. Tests edit its manifest and shards to make them hostile.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/shard_file.h"

namespace strata::checkpoint::testing {

inline Manifest TinyManifest(int64_t step) {
  Manifest m;
  m.step = step;
  m.world_size = 2;
  m.stage = 3;
  m.param_dtype = "fp32";
  m.optimizer = "adamw";
  m.units = {ManifestUnit{"u", {ManifestParam{"w", {2, 5}, 0, 10, true}, ManifestParam{"b", {3}, 12, 3, false}}}};
  return m;
}

// Writes the shard of `rank` into `dir`; ranges as the engine lays them out.
inline void WriteTinyShard(const std::string& dir, int rank, Manifest* m) {
  const std::vector<std::string> kinds = StateKinds("adamw");
  std::vector<ShardRange> ranges;
  const uint64_t lo = rank * 8u, hi = lo + 8;
  for (const std::string& kind : kinds) {
    for (const ManifestParam& p : m->units[0].params) {
      const uint64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (b < e) ranges.push_back({"u", p.name, kind, b, e - b});
    }
  }
  const std::string file = "shard_0000" + std::to_string(rank) + ".bin";
  auto w = ShardWriter::Create(dir + "/" + file, rank, 2, ranges);
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const size_t k = std::find(kinds.begin(), kinds.end(), ranges[i].kind) - kinds.begin();
    std::vector<float> v(ranges[i].count);
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(ranges[i].begin + j + 100 * k);
    ASSERT_TRUE(w->Write(i, v.data()).ok());
  }
  auto done = w->Finish();
  ASSERT_TRUE(done.ok()) << done.status();
  m->shards.push_back({rank, file, done->second, done->first});
}

inline Manifest WriteTinyCheckpoint(const std::string& dir, int64_t step = 3) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  Manifest m = TinyManifest(step);
  WriteTinyShard(dir, 0, &m);
  WriteTinyShard(dir, 1, &m);
  EXPECT_TRUE(WriteFileAtomic(dir + "/" + kManifestName, ToJson(m)).ok());
  return m;
}

inline nlohmann::json ReadManifestJson(const std::string& dir) {
  std::ifstream in(dir + "/" + kManifestName);
  return nlohmann::json::parse(in);
}

inline void WriteManifestJson(const std::string& dir, const nlohmann::json& j) {
  std::ofstream(dir + "/" + kManifestName) << j.dump(1);
}

}  // namespace strata::checkpoint::testing
