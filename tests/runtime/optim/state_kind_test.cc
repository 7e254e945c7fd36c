// The state kinds: their on-disk names (the checkpoint format: existing checkpoints must keep loading),
// the order each optimizer keeps them in, and the index that orders the NVMe tile lanes.
#include "runtime/optim/state_kind.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "runtime/optim/optimizer.h"

namespace strata::optim {
namespace {

TEST(StateKind, NamesAreTheCheckpointFormatsAndParseBack) {
  // The strings shard files written before the enum existed hold; changing one breaks old checkpoints.
  EXPECT_EQ(StateKindName(StateKind::kMaster), "master");
  EXPECT_EQ(StateKindName(StateKind::kExpAvg), "exp_avg");
  EXPECT_EQ(StateKindName(StateKind::kExpAvgSq), "exp_avg_sq");
  EXPECT_EQ(StateKindName(StateKind::kMomentum), "momentum");
  for (StateKind k : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq, StateKind::kMomentum}) {
    EXPECT_EQ(ParseStateKind(StateKindName(k)), k);
  }
  EXPECT_FALSE(ParseStateKind("Master").has_value());
  EXPECT_FALSE(ParseStateKind("").has_value());
  EXPECT_FALSE(ParseStateKind("exp_avg_sq ").has_value());
}

TEST(StateKind, EachOptimizerKeepsMasterFirstThenItsMoments) {
  EXPECT_EQ(StateKinds(OptimizerType::kAdamW),
            (std::vector<StateKind>{StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq}));
  EXPECT_EQ(StateKinds(OptimizerType::kSgd), (std::vector<StateKind>{StateKind::kMaster, StateKind::kMomentum}));
  // StateBuffers (the moments the engine allocates) is derived from the same list.
  for (OptimizerType t : {OptimizerType::kAdamW, OptimizerType::kSgd}) {
    OptimizerConfig cfg;
    cfg.type = t;
    EXPECT_EQ(StateBuffers(cfg) + 1, static_cast<int>(StateKinds(t).size()));
  }
}

TEST(StateKind, IndexIsThePositionInTheOptimizersList) {
  for (OptimizerType t : {OptimizerType::kAdamW, OptimizerType::kSgd}) {
    const std::vector<StateKind> kinds = StateKinds(t);
    std::set<int> seen;
    for (size_t i = 0; i < kinds.size(); ++i) {
      EXPECT_EQ(StateIndex(kinds[i]), static_cast<int>(i));
      seen.insert(StateIndex(kinds[i]));
    }
    EXPECT_EQ(seen.size(), kinds.size());
  }
}

}  // namespace
}  // namespace strata::optim
