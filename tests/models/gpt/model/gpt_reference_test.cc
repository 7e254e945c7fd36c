// The GPT-2 forward loss, every parameter gradient and one AdamW step against PyTorch (float64), from the
// committed fixture written by tests/reference/make_gpt_fixture.py. No PyTorch is needed here.
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/weights/weights.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"

#ifndef STRATA_SOURCE_DIR
#error "STRATA_SOURCE_DIR must point at the repository root"
#endif

namespace strata::gpt {
namespace {

using checkpoint::SafetensorsReader;

const std::string kFixture = std::string(STRATA_SOURCE_DIR) + "/tests/reference/gpt_fixture.safetensors";

double Meta(const SafetensorsReader& r, const std::string& key) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(r.metadata().at(key), &v)) << key;
  return v;
}

std::vector<float> Read(const SafetensorsReader& r, const std::string& name) {
  const auto* t = r.Find(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? r.ReadF32(*t).value() : std::vector<float>();
}

// |got - want| <= rtol * max(|want|, rms(want)): relative, with the tensor's own scale as the floor.
void ExpectTensorNear(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sq = 0;
  for (float w : want) sq += double(w) * w;
  const double rms = std::sqrt(sq / std::max<size_t>(1, want.size()));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]) / std::max({std::fabs(double(want[i])), rms, 1e-30});
    if (!(err <= rtol) && bad++ < 3) {
      ADD_FAILURE() << what << "[" << i << "]: expected " << want[i] << " actual " << got[i] << " (rel " << err << ")";
    }
  }
}

struct Fixture {
  SafetensorsReader fixture = SafetensorsReader::Open(kFixture).value();
  GptConfig cfg;
  int B = 0;
  std::vector<int32_t> inputs, targets;
  Fixture() {
    cfg = GptConfig{int(Meta(fixture, "layers")), int(Meta(fixture, "d_model")), int(Meta(fixture, "heads")),
                    int(Meta(fixture, "seq_len")), int(Meta(fixture, "vocab"))};
    B = int(Meta(fixture, "batch"));
    for (float v : Read(fixture, "inputs")) inputs.push_back(static_cast<int32_t>(v));
    for (float v : Read(fixture, "targets")) targets.push_back(static_cast<int32_t>(v));
  }
  engine::EngineConfig Engine(int accum) const {
    engine::EngineConfig ec;
    ec.stage = 0;
    ec.gradient_accumulation_steps = accum;
    ec.optimizer.lr = Meta(fixture, "lr");
    ec.optimizer.beta1 = Meta(fixture, "beta1");
    ec.optimizer.beta2 = Meta(fixture, "beta2");
    ec.optimizer.eps = Meta(fixture, "eps");
    ec.optimizer.weight_decay = Meta(fixture, "weight_decay");
    return ec;
  }
};

TEST(GptReference, LossAndEveryGradientMatchPyTorch) {
  Fixture s;
  auto comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
  // Two accumulation steps: stage 0 keeps this micro-batch's gradients untouched until the last one.
  auto e = std::move(engine::Engine::Create(s.Engine(2), *comms[0], dev)).value();
  GptModel model = std::move(GptModel::Register(*e, s.cfg)).value();
  ASSERT_TRUE(e->Finalize().ok());
  for (const HfParam& p : model.hf_params()) ASSERT_TRUE(e->SetParam(p.unit, p.param, Read(s.fixture, p.name)).ok());
  ASSERT_TRUE(e->BeginMicroBatch().ok());
  auto loss = model.TrainMicroBatch(*e, s.inputs.data(), s.targets.data(), s.B, 1.0f, false);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(e->EndMicroBatch().ok());
  const double want = Read(s.fixture, "loss")[0];
  EXPECT_NEAR(*loss, want, 1e-5 * std::fabs(want));
  for (const HfParam& p : model.hf_params()) {
    const float* g = e->Grad(p.unit, p.param);
    const std::vector<float> got(g, g + e->layout(p.unit).params[p.param].numel);
    ExpectTensorNear(got, Read(s.fixture, "grad." + p.name), 1e-5, "grad." + p.name);
  }
}

TEST(GptReference, OneAdamWStepMatchesTorch) {
  Fixture s;
  auto comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
  auto e = std::move(engine::Engine::Create(s.Engine(1), *comms[0], dev)).value();
  GptModel model = std::move(GptModel::Register(*e, s.cfg)).value();
  ASSERT_TRUE(e->Finalize().ok());
  for (const HfParam& p : model.hf_params()) ASSERT_TRUE(e->SetParam(p.unit, p.param, Read(s.fixture, p.name)).ok());
  ASSERT_TRUE(e->BeginMicroBatch().ok());
  ASSERT_TRUE(model.TrainMicroBatch(*e, s.inputs.data(), s.targets.data(), s.B, 1.0f, false).ok());
  ASSERT_TRUE(e->EndMicroBatch().ok());
  ASSERT_TRUE(e->Step().ok());
  // Adam's first step moves each element by about lr * sign(g). Where the gradient is zero in exact
  // arithmetic (the key bias: softmax ignores a constant added to every score of a row), float64 gives
  // ~1e-17 and fp32 gives rounding noise of either sign, so those elements are only checked to have
  // moved by at most lr; every other element must match torch within 1e-5.
  const double lr = s.Engine(1).optimizer.lr;
  int noise_elements = 0;
  for (const HfParam& p : model.hf_params()) {
    const std::vector<float> got = e->GatherParam(p.unit, p.param).value();
    std::vector<float> want = Read(s.fixture, "adamw." + p.name);
    const std::vector<float> grad = Read(s.fixture, "grad." + p.name), before = Read(s.fixture, p.name);
    std::vector<float> masked_got = got;
    for (size_t i = 0; i < grad.size(); ++i) {
      if (std::fabs(grad[i]) < 1e-9) {
        EXPECT_LE(std::fabs(got[i] - before[i]), lr * 1.001) << p.name << "[" << i << "]";
        masked_got[i] = want[i];
        ++noise_elements;
      }
    }
    ExpectTensorNear(masked_got, want, 1e-5, "adamw." + p.name);
  }
  EXPECT_LE(noise_elements, s.cfg.layers * s.cfg.d_model) << "only the key biases have zero gradients";
}

}  // namespace
}  // namespace strata::gpt
