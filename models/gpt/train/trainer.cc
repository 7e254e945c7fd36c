#include "models/gpt/train/trainer.h"

#include <utility>

#include "runtime/base/status.h"

namespace strata::tools {

absl::StatusOr<GptRun> BringUp(const engine::EngineConfig& config, const gpt::GptConfig& model,
                               comm::Communicator& world, device::Device& dev, std::unique_ptr<gpt::NnBackend> nn) {
  STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(config, world, dev));
  STRATA_ASSIGN_OR_RETURN(gpt::GptModel m, gpt::GptModel::Register(*e, model, std::move(nn)));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  return GptRun{std::move(e), std::move(m)};
}

absl::StatusOr<double> RunMicroBatches(GptRun& run, int count, int micro, bool checkpointing,
                                       const std::function<absl::StatusOr<MicroBatchInput>(int)>& next) {
  engine::Engine& e = *run.engine;
  double loss = 0;
  for (int a = 0; a < count; ++a) {
    STRATA_ASSIGN_OR_RETURN(const MicroBatchInput in, next(a));
    STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
    STRATA_ASSIGN_OR_RETURN(const double l,
                            run.model.TrainMicroBatch(e, in.inputs, in.targets, micro, in.loss_scale, checkpointing));
    STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
    loss += l / count;
  }
  return loss;
}

}  // namespace strata::tools
