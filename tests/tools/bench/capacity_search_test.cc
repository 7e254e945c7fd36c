// Note [Capacity search] (tools/bench/capacity_search.h): the sizes `strata bench capacity` tries. Without
// a prediction, exactly the doubling-then-bisection walk it always made (against a copy of that loop as
// the oracle); with one, the predicted size first, the search over after it when it fits, and a bisection
// below it, never above, when it does not; and the prediction itself is the engine's accounting: the
// largest size whose tiers fit the budgets and the free disk less the reserve.
#include "tools/bench/capacity_search.h"

#include <gtest/gtest.h>

#include <vector>

#include "models/gpt/model/gpt_config.h"
#include "models/gpt/spec/gpt_spec.h"
#include "tools/plan/plan_units.h"

namespace strata::tools {
namespace {

// The sizes tried against a box where sizes up to `largest` fit; the largest fit through *found.
std::vector<int64_t> Walk(int64_t base, bool use_prediction, int64_t predicted, int64_t largest, int64_t* found) {
  std::vector<int64_t> tried;
  CandidateState s = FirstCandidate(base, use_prediction, predicted);
  for (int i = 0; i < 200; ++i) {
    tried.push_back(s.k);
    if (!NextCandidate(s, s.k <= largest)) break;
  }
  *found = s.good;
  return tried;
}

// The search loop as bench_capacity.cc had it before the prediction (doubling, then bisection).
std::vector<int64_t> OldWalk(int64_t k, int64_t largest) {
  std::vector<int64_t> tried;
  int64_t good = 0, bad = 0;
  while (bad == 0 || bad - good > 1) {
    tried.push_back(k);
    (k <= largest ? good : bad) = k;
    k = bad == 0 ? 2 * k : (good + bad) / 2;
    if (bad != 0 && k == good) break;
  }
  return tried;
}

TEST(CapacitySearch, WithoutPredictionTheWalkIsTheOldOne) {
  for (int64_t base : {1, 2, 3, 7}) {
    for (int64_t largest = base; largest < 300; ++largest) {
      int64_t found = 0;
      EXPECT_EQ(Walk(base, false, 0, largest, &found), OldWalk(base, largest)) << base << " " << largest;
      EXPECT_EQ(found, largest);
    }
  }
}

TEST(CapacitySearch, AnExactPredictionIsTheOnlyCandidate) {
  for (int64_t largest : {1, 2, 5, 64, 1000, 4097}) {
    int64_t found = 0;
    EXPECT_EQ(Walk(1, true, largest, largest, &found), std::vector<int64_t>{largest});
    EXPECT_EQ(found, largest);
  }
}

TEST(CapacitySearch, AnOptimisticPredictionBisectsBelowIt) {
  for (int64_t predicted : {2, 10, 1000}) {
    for (int64_t largest = 1; largest < predicted; ++largest) {
      int64_t found = 0;
      const std::vector<int64_t> tried = Walk(1, true, predicted, largest, &found);
      EXPECT_EQ(tried.front(), predicted);
      EXPECT_EQ(found, largest) << predicted;
      for (int64_t k : tried) EXPECT_LE(k, predicted);
      EXPECT_LE(tried.size(), 12u) << "log2 of the prediction, and one";
    }
  }
}

TEST(CapacitySearch, NothingPredictedTriesTheSmallestOnly) {
  for (int64_t largest : {0, 1, 50}) {  // the smallest fails (its failure names why), or fits past the prediction
    int64_t found = 0;
    EXPECT_EQ(Walk(4, true, 0, largest, &found), std::vector<int64_t>{1});
    EXPECT_EQ(found, std::min<int64_t>(largest, 1));
  }
}

TEST(CapacitySearch, APessimisticPredictionIsNotExceeded) {
  for (int64_t predicted : {1, 3, 100}) {
    int64_t found = 0;
    EXPECT_EQ(Walk(1, true, predicted, 10 * predicted, &found), std::vector<int64_t>{predicted});
    EXPECT_EQ(found, predicted);
  }
}

TEST(CapacitySearch, LargestFittingFindsTheEdge) {
  for (int64_t limit : {1, 2, 9, 64, 1000}) {
    for (int64_t largest = 0; largest < 130; ++largest) {
      int64_t top = 0;
      auto r = LargestFitting(limit, [&](int64_t k) -> absl::StatusOr<bool> {
        EXPECT_GE(k, 1);
        EXPECT_LE(k, limit);
        top = std::max(top, k);
        return k <= largest;
      });
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(*r, std::min(largest, limit)) << limit;
      EXPECT_LE(top, std::max<int64_t>(2 * largest, 1));
    }
  }
  auto r = LargestFitting(8, [](int64_t k) -> absl::StatusOr<bool> {
    if (k > 2) return absl::InternalError("broken accounting");
    return true;
  });
  EXPECT_EQ(r.status().message(), "broken accounting");
}

// An NVMe config of a tiny GPT: the prediction is the edge of the accounting's NVMe need against the
// free disk less the reserve, then of the host budget, then of --max-params.
PredictInput NvmeInput() {
  PredictInput in;
  in.base = gpt::Spec(gpt::GptConfig{1, 32, 2, 16, 64});
  in.engine.stage = 3;
  in.engine.param_dtype = DType::kBF16;
  in.engine.bf16 = true;
  in.engine.optimizer_in_backward = true;
  in.engine.offload_param.device = engine::OffloadDevice::kNvme;
  in.engine.offload_optimizer.device = engine::OffloadDevice::kNvme;
  in.engine.train_micro_batch_size_per_gpu = 1;
  return in;
}

uint64_t NvmeNeed(const PredictInput& in, int64_t layers) {
  plan::PlanInput p;
  p.model = Scaled(in.base, false, layers);
  p.engine = in.engine;
  p.device.gpu = false;
  return plan::LayOutEngine(p)->need.tier[static_cast<int>(memory::Tier::kNvme)];
}

TEST(CapacitySearch, ThePredictionIsTheAccountingsEdge) {
  PredictInput in = NvmeInput();
  const uint64_t at20 = NvmeNeed(in, 20), at21 = NvmeNeed(in, 21);
  ASSERT_LT(at20, at21);
  in.disk_reserve = 1 << 20;
  for (uint64_t room : {at20, at21 - 1}) {
    in.free_disk = room + in.disk_reserve;
    EXPECT_EQ(*PredictLargest(in, 1 << 30), 20);
    EXPECT_EQ(*PredictedShortfall(in, 20), "");
    EXPECT_NE(PredictedShortfall(in, 21)->find("tier 'nvme' needs"), std::string::npos) << *PredictedShortfall(in, 21);
  }
  in.free_disk = at21 + in.disk_reserve;
  EXPECT_EQ(*PredictLargest(in, 1 << 30), 21);
  EXPECT_EQ(*PredictLargest(in, 7), 7);  // the limit
  in.free_disk = 1ull << 40;
  in.max_params = gpt::NumParams(*gpt::ConfigOf(*Scaled(in.base, false, 9)));
  EXPECT_EQ(*PredictLargest(in, 1 << 30), 9);
  EXPECT_NE(PredictedShortfall(in, 10)->find("over --max-params"), std::string::npos);
  // The host budget: the accounting's pinned-host need at 1 layer, and one byte less.
  in.max_params = 0;
  plan::PlanInput p;
  p.model = in.base;
  p.engine = in.engine;
  p.device.gpu = false;
  const uint64_t host = plan::LayOutEngine(p)->need.tier[1];
  ASSERT_GT(host, 0u);
  in.engine.host_budget_bytes = host - 1;
  EXPECT_EQ(*PredictLargest(in, 1 << 30), 0);
  EXPECT_NE(PredictedShortfall(in, 1)->find("tier 'pinned_host' needs"), std::string::npos);
}

}  // namespace
}  // namespace strata::tools
