// The kinds of fp32 state an optimizer keeps per element, named once. The engine addresses its state by
// kind wherever it lives (device, pinned host, NVMe tiles), checkpoints name their ranges and check
// coverage by kind, and the NVMe tile lanes are ordered by StateIndex. Header-only so that checkpoint/
// (above optim/ in docs/layers.txt) uses it without linking the optimizer kernels.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "runtime/optim/hyper.h"

namespace strata::optim {

// kMaster is the fp32 master weight; kExpAvg / kExpAvgSq are AdamW's first and second moments (m, v);
// kMomentum is SGD's momentum buffer (SGD keeps no second moment).
enum class StateKind { kMaster, kExpAvg, kExpAvgSq, kMomentum };

// The name a checkpoint shard file gives each kind (on-disk format: these strings never change).
constexpr std::string_view StateKindName(StateKind k) {
  switch (k) {
    case StateKind::kMaster: return "master";
    case StateKind::kExpAvg: return "exp_avg";
    case StateKind::kExpAvgSq: return "exp_avg_sq";
    case StateKind::kMomentum: return "momentum";
  }
  return "?";
}

// The kind `name` (StateKindName) names; nullopt for any other string (shard files are untrusted input).
inline std::optional<StateKind> ParseStateKind(std::string_view name) {
  for (StateKind k : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq, StateKind::kMomentum}) {
    if (name == StateKindName(k)) return k;
  }
  return std::nullopt;
}

// The kinds optimizer `type` keeps, master first, then its moments: AdamW master, exp_avg, exp_avg_sq;
// SGD master, momentum. Checkpoints write them in this order.
inline std::vector<StateKind> StateKinds(OptimizerType type) {
  if (type == OptimizerType::kAdamW) return {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq};
  return {StateKind::kMaster, StateKind::kMomentum};
}

// The position of `k` in its optimizer's StateKinds list: 0 master, 1 the first moment (exp_avg or
// momentum), 2 exp_avg_sq. What orders the lanes of the NVMe tiled update (runtime/offload/tiled_pipeline.h).
constexpr int StateIndex(StateKind k) { return k == StateKind::kMomentum ? 1 : static_cast<int>(k); }

}  // namespace strata::optim
