// `strata bench scaling`: weak scaling of the training step, 1 rank against N ranks.
//
// It launches `strata bench step --json` twice through the MPI launcher (mpirun -n 1, then -n N), the
// same model and per-rank micro-batch both times, and reports samples/s per rank and the scaling
// efficiency = (samples/s per rank at N) / (samples/s at 1): 1.0 is perfect weak scaling. Next to it,
// the ratio of the per-rank sgemm rates each run measured: on a machine whose cores are shared, ranks
// slow each other's compute too, and that ratio is the part of the loss that communication did not cause.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace strata::tools {

struct ScalingSummary {
  int ranks = 0;                      // N
  double samples_per_s_1 = 0;         // at 1 rank
  double samples_per_s_per_rank_n = 0;
  double efficiency = 0;              // samples_per_s_per_rank_n / samples_per_s_1
  double sgemm_ratio = 0;             // sgemm GFLOP/s per rank at N / at 1 (0 when not reported)
};

// From the two `bench step --json` objects; InvalidArgument naming the missing field, or when the
// runs are not comparable (different model, micro-batch or sequence length).
absl::StatusOr<ScalingSummary> SummariseScaling(const nlohmann::json& one_rank, const nlohmann::json& n_ranks);

}  // namespace strata::tools
