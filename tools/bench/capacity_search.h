// The candidate choice of `strata bench capacity`: the sizes it tries, in order (Note [Capacity search]).
//
// Note [Capacity search]: without NVMe offload the search doubles the size from the base model's (its size in
// the direction that grows, spec::ModelSpec::Grows: the GPT's layers, or d_model / heads) until a
// candidate does not fit, then bisects between the last fit and the first failure; a candidate that does
// not fit fails at Finalize, before any step, so the walk is cheap. With NVMe a candidate costs disk I/O
// in proportion to its size (a model near the disk's bound moves ~30 B/param a step, minutes each), so the
// search starts at the largest size the engine's accounting (EngineMemoryNeed: what Finalize checks and
// `strata plan` reports) predicts to fit every budget, the free disk less --disk-reserve and
// --max-params. When that fits, the next size is known not to (the accounting says so) and the search ends
// after one candidate; when it does not (something the accounting does not see), it bisects below it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/engine/config.h"
#include "spec/model_spec.h"

namespace strata::tools {

// The model of size k in depth or width (ModelSpec::Scaled; the GPT: k layers, or d_model = k x heads).
std::shared_ptr<const spec::ModelSpec> Scaled(const std::shared_ptr<const spec::ModelSpec>& m, bool width, int64_t k);

struct CandidateState {
  int64_t good = 0;  // the largest size that fitted, 0 = none yet
  int64_t bad = 0;   // the smallest that did not (or is known not to), 0 = none yet
  int64_t k = 1;     // the next to try
};
// The first candidate: `predicted` when the search uses the prediction (at least 1: a prediction of 0,
// nothing fits, is tried at 1 so that its failure names the reason), else `base`. With the prediction
// the size after it counts as the first failure from the start: nothing larger is ever tried.
CandidateState FirstCandidate(int64_t base, bool use_prediction, int64_t predicted);
// Records the outcome of candidate s.k and picks the next. Returns false once converged: s.good is then
// the largest size that fitted (0: none).
bool NextCandidate(CandidateState& s, bool fitted);

// The largest k in [1, limit] with fits(k), for a monotone `fits` (true up to some k, false after);
// 0 when fits(1) is false. Doubling then bisection: O(log k) calls, none above 2k.
absl::StatusOr<int64_t> LargestFitting(int64_t limit, const std::function<absl::StatusOr<bool>(int64_t)>& fits);

struct PredictInput {
  std::shared_ptr<const spec::ModelSpec> base;
  engine::EngineConfig engine;
  bool width = false;
  int ranks = 1;
  uint64_t free_disk = 0;     // on the NVMe path(s), shared by the ranks
  uint64_t disk_reserve = 0;  // of it left unused
  int64_t max_params = 0;     // 0 = no bound
};
// Why the model of size k does not fit by the engine's accounting (the first tier over its room, or
// --max-params), "" when it fits.
absl::StatusOr<std::string> PredictedShortfall(const PredictInput& in, int64_t k);
// The largest size that fits by the accounting (0: none), up to `limit`.
absl::StatusOr<int64_t> PredictLargest(const PredictInput& in, int64_t limit);

}  // namespace strata::tools
