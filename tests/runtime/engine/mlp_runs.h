// Trains the example MLP through the engine over in-process ranks and keeps what the equivalence tests
// compare: the tests that run one configuration against another (a key on against off) share it.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::testing {

struct MlpRun {
  std::vector<float> params;              // every parameter, gathered
  engine::MemoryStats mem;                // rank 0's, after the last step
  uint64_t grad_shard_elems = 0;          // rank 0's gradient shard elements, summed over the units
  std::vector<engine::StepResult> steps;  // rank 0's
};

// `steps` steps of 8 samples each, split over `world` ranks and cfg.gradient_accumulation_steps
// micro-batches per rank (sample s*8 + (micro_batch*world + rank)*micro onwards), on host devices.
inline absl::StatusOr<MlpRun> TrainMlp(const engine::EngineConfig& cfg, int world, const mlp::MlpShape& shape,
                                       int steps) {
  MlpRun out;
  std::mutex mu;
  auto results = RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(cfg, c, dev));
    STRATA_ASSIGN_OR_RETURN(mlp::Mlp mlp, mlp::Mlp::Register(*e, shape));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    const int accum = cfg.gradient_accumulation_steps, micro = 8 / (world * accum);
    std::vector<engine::StepResult> rs;
    for (int s = 0; s < steps; ++s) {
      for (int mb = 0; mb < accum; ++mb) {
        STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
        const int64_t first = int64_t{s} * 8 + (int64_t{mb} * world + rank) * micro;
        STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, first, micro).status());
        STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      }
      STRATA_ASSIGN_OR_RETURN(engine::StepResult r, e->Step());
      rs.push_back(r);
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> all, e->GatherAllParams());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.params = std::move(all);
      out.mem = e->memory_stats();
      out.steps = std::move(rs);
      for (int u = 0; u < e->num_units(); ++u) out.grad_shard_elems += e->layout(u).shard_elems;
    }
    return absl::OkStatus();
  });
  for (const auto& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

}  // namespace strata::testing
