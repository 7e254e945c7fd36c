// Tests for models/gpt/weights: a file that names one parameter twice ("wte.weight" and
// "transformer.wte.weight", which the loader strips to the same name) is refused naming both tensors,
// where one of them used to be picked silently; a file the saver wrote loads back; a NaN or Inf weight is
// refused naming the tensor and its index (it used to load and surface as "training diverged").
#include "models/gpt/weights/weights.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/checkpoint/write_tensors.h"

namespace strata::gpt {
namespace {

using ::testing::HasSubstr;

// A one-layer GPT (d_model 8, vocab 11) registered on a one-rank stage-0 engine.
class LoadWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comms_ = comm::CreateInProcessGroup(1, comm::Options{});
    engine::EngineConfig ec;
    ec.stage = 0;
    engine_ = std::move(engine::Engine::Create(ec, *comms_[0], dev_)).value();
    model_.emplace(std::move(GptModel::Register(*engine_, GptConfig{1, 8, 2, 4, 11})).value());
    ASSERT_TRUE(engine_->Finalize().ok());
  }
  std::vector<std::unique_ptr<comm::Communicator>> comms_;
  device::HostDevice dev_;
  std::unique_ptr<engine::Engine> engine_;
  std::optional<GptModel> model_;
};

TEST_F(LoadWeightsTest, BothSpellingsOfOneTensorAreAmbiguous) {
  auto& e = engine_;
  GptModel& model = *model_;
  const std::string saved = ::testing::TempDir() + "/weights_ok.safetensors";
  ASSERT_TRUE(SaveWeights(*e, model, saved, true).ok());
  ASSERT_TRUE(LoadWeights(*e, model, saved).ok());

  const std::string path = ::testing::TempDir() + "/weights_twice.safetensors";
  auto zeros = [](size_t n) { return [n] { return absl::StatusOr<std::vector<float>>(std::vector<float>(n, 0.0f)); }; };
  ASSERT_TRUE(checkpoint::testing::WriteTensors(
                  path, {{"transformer.wte.weight", {11, 8}, zeros(88)}, {"wte.weight", {11, 8}, zeros(88)}})
                  .ok());
  const absl::Status s = LoadWeights(*e, model, path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds both 'transformer.wte.weight' and 'wte.weight'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST_F(LoadWeightsTest, ANonFiniteWeightIsRefusedNamingTheTensorAndIndex) {
  auto& e = engine_;
  GptModel& model = *model_;
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<checkpoint::testing::SourceTensor> tensors;
    for (const HfParam& p : model.hf_params()) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      const bool poisoned = p.name == "h.0.ln_1.weight";
      tensors.push_back({p.name, p.shape, [n, poisoned, bad] {
                           std::vector<float> v(static_cast<size_t>(n), 0.5f);
                           if (poisoned) v[3] = bad;
                           return absl::StatusOr<std::vector<float>>(std::move(v));
                         }});
    }
    const std::string path = ::testing::TempDir() + "/weights_nonfinite.safetensors";
    ASSERT_TRUE(checkpoint::testing::WriteTensors(path, tensors).ok());
    const absl::Status s = LoadWeights(*e, model, path);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("weights file '" + path + "': tensor 'h.0.ln_1.weight' holds "));
    EXPECT_THAT(std::string(s.message()), HasSubstr(" at index 3; weights must be finite"));
  }
}

}  // namespace
}  // namespace strata::gpt
