#include "models/gpt/train/gpt_family.h"

#include <random>
#include <utility>
#include <vector>

#include "models/gpt/model/gpt_model.h"
#include "models/gpt/spec/gpt_spec.h"
#include "models/gpt/train/compute.h"
#include "models/gpt/train/train_options.h"
#include "models/gpt/train/trainer.h"
#include "runtime/base/status.h"

namespace strata::gpt {
namespace {

class GptCompute final : public spec::Compute {
 public:
  explicit GptCompute(tools::Compute c) : gpu_(c.nn != nullptr), c_(std::move(c)) {}
  device::Device& device() override { return *c_.device; }
  bool gpu() const override { return gpu_; }
  std::string name() const override { return c_.name; }
  absl::StatusOr<double> Bf16MatmulFlops() override {
    if (c_.nn == nullptr) return absl::FailedPreconditionError("the host back-end has no bf16 matrix products");
    return c_.nn->Bf16MatmulFlops();
  }
  // The back-end, handed to the model once (nullptr: the host kernels), and how it multiplies.
  std::unique_ptr<NnBackend> TakeNn() { return std::move(c_.nn); }
  Products products() const { return c_.products; }

 private:
  bool gpu_;
  tools::Compute c_;
};

class GptTrainer final : public spec::Trainer {
 public:
  GptTrainer(tools::GptRun run, Products products) : run_(std::move(run)), products_(products) {}
  engine::Engine& engine() override { return *run_.engine; }
  void SynthesizeTokens(uint32_t seed, int micro) override {
    const GptConfig& c = run_.model.config();
    micro_ = micro;
    tokens_.assign(size_t(micro) * c.seq_len, 0);
    std::mt19937 rng(seed);
    for (int32_t& t : tokens_) t = static_cast<int32_t>(rng() % c.vocab);
  }
  absl::StatusOr<double> RunMicroBatches(int count, bool checkpointing) override {
    engine::Engine& e = *run_.engine;
    return tools::RunMicroBatches(run_, count, micro_, checkpointing,
                                  [&](int) -> absl::StatusOr<tools::MicroBatchInput> {
                                    return tools::MicroBatchInput{tokens_.data(), tokens_.data(), e.loss_scale()};
                                  });
  }
  spec::Facts facts() const override {
    return {{"matmul", ProductsName(products_)}, {"attention", run_.model.nn().attention_in_use()}};
  }
  uint64_t activation_bytes() const override { return run_.model.workspace_bytes(); }

 private:
  tools::GptRun run_;
  Products products_;
  int micro_ = 0;
  std::vector<int32_t> tokens_;
};

class GptSetup final : public spec::TrainSetup {
 public:
  explicit GptSetup(tools::TrainOptions o) : options_(std::move(o)) {
    model = Spec(options_.model);
    engine = options_.engine;
    checkpointing = options_.checkpointing;
    steps = options_.steps;
  }
  device::DeviceKind device_kind() const override { return tools::DeviceKindFor(options_.device); }
  absl::StatusOr<std::unique_ptr<spec::Compute>> MakeCompute(std::optional<int> local_rank) const override {
    const tools::TrainOptions& o = options_;
    STRATA_ASSIGN_OR_RETURN(tools::Compute c,
                            tools::MakeCompute(o.device, o.matmul, o.attention, o.engine.param_dtype, local_rank));
    return std::make_unique<GptCompute>(std::move(c));
  }
  const tools::TrainOptions& options() const { return options_; }

 private:
  tools::TrainOptions options_;
};

class GptFamily final : public spec::Family {
 public:
  std::string name() const override { return "gpt"; }
  std::vector<spec::FlagDef> TrainFlagDefs() const override { return tools::TrainFlagDefs(); }
  absl::StatusOr<std::unique_ptr<spec::TrainSetup>> ParseTrain(const std::vector<std::string>& args,
                                                               int world_size) const override {
    STRATA_ASSIGN_OR_RETURN(tools::TrainOptions o, tools::ParseTrainOptions(args, world_size));
    return std::make_unique<GptSetup>(std::move(o));
  }
  absl::StatusOr<std::unique_ptr<spec::Trainer>> BringUp(const spec::ModelSpec& model,
                                                         const engine::EngineConfig& config, comm::Communicator& world,
                                                         device::Device& dev, spec::Compute* compute) const override {
    const GptConfig* cfg = ConfigOf(model);
    if (cfg == nullptr) return absl::InvalidArgumentError("the gpt family brings up GPTs only (gpt::Spec)");
    std::unique_ptr<NnBackend> nn;
    Products products = Products::kF32;
    if (compute != nullptr) {
      auto* mine = dynamic_cast<GptCompute*>(compute);
      if (mine == nullptr) return absl::InvalidArgumentError("the gpt family runs on its own Compute only");
      nn = mine->TakeNn();
      products = mine->products();
    }
    STRATA_ASSIGN_OR_RETURN(tools::GptRun run, tools::BringUp(config, *cfg, world, dev, std::move(nn)));
    return std::make_unique<GptTrainer>(std::move(run), products);
  }
  // run_files.cc writes the trainer state's "model_kind"; the export keeps Hugging Face's names.
  std::string checkpoint_kind() const override { return "gpt2"; }
  std::string ExportName(const std::string& unit, const std::string& param) const override {
    return HfName(unit, param);
  }
  std::string export_names() const override { return "Hugging Face GPT-2 names"; }
};

}  // namespace

std::unique_ptr<spec::Family> MakeFamily() { return std::make_unique<GptFamily>(); }

const tools::TrainOptions* OptionsOf(const spec::TrainSetup& setup) {
  const auto* g = dynamic_cast<const GptSetup*>(&setup);
  return g == nullptr ? nullptr : &g->options();
}

}  // namespace strata::gpt
