// GPT model properties that need no reference framework: causality (logits at position t do not depend
// on later tokens), gradients against central finite differences, activation checkpointing giving the
// same gradients, and the tied embedding receiving both gradient contributions.
#include "models/gpt/model/gpt_model.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"

namespace strata::gpt {
namespace {

struct Harness {
  std::vector<std::unique_ptr<comm::Communicator>> comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
  std::unique_ptr<engine::Engine> e;
  std::unique_ptr<GptModel> model;

  explicit Harness(const GptConfig& c, int stage = 0, bool weight_decay_1d = false) {
    engine::EngineConfig ec;
    ec.stage = stage;
    ec.weight_decay_1d = weight_decay_1d;
    ec.optimizer.lr = 1e-3;
    e = std::move(engine::Engine::Create(ec, *comms[0], dev)).value();
    model = std::make_unique<GptModel>(std::move(GptModel::Register(*e, c)).value());
    EXPECT_TRUE(e->Finalize().ok());
  }
};

GptConfig Tiny() { return GptConfig{2, 16, 2, 8, 11}; }

std::vector<int32_t> Tokens(int n, int vocab, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// strata.weight_decay_1d: the GPT's own rule decays the 2-D weights only; DeepSpeed's (a JSON config's
// default) decays the biases and LayerNorms too.
TEST(GptModel, WeightDecayOfOneDimensionalParametersFollowsTheConfig) {
  for (const bool decay_1d : {false, true}) {
    Harness h(Tiny(), 0, decay_1d);
    int decayed = 0, kept = 0;
    for (int u = 0; u < h.e->num_units(); ++u) {
      for (const shard::Segment& seg : h.e->layout(u).FullSegments()) (seg.weight_decay ? decayed : kept)++;
    }
    EXPECT_EQ(kept == 0, decay_1d) << decayed << " decayed, " << kept << " kept";
    EXPECT_GT(decayed, 0);
  }
}

// A non-finite loss with every token in range is divergence, told apart from bad data (it once always read
// "a target token is outside the vocabulary"); a token that really is outside is named with its position.
TEST(GptModel, ANonFiniteLossIsDivergenceNotBadData) {
  const GptConfig c = Tiny();
  Harness h(c);
  std::vector<int32_t> in = Tokens(c.seq_len, c.vocab, 3), tgt = Tokens(c.seq_len, c.vocab, 4);
  auto fine = h.model->Forward(*h.e, in.data(), tgt.data(), 1, c.seq_len, nullptr);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_TRUE(std::isfinite(*fine));

  std::vector<int32_t> bad = tgt;
  bad[5] = c.vocab;
  auto oov = h.model->Forward(*h.e, in.data(), bad.data(), 1, c.seq_len, nullptr);
  ASSERT_FALSE(oov.ok());
  EXPECT_EQ(oov.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsDivergence(oov.status()));
  EXPECT_NE(oov.status().message().find("a target token is outside the vocabulary: token 11 at position 5"),
            absl::string_view::npos) << oov.status();
  bad = in;
  bad[0] = -1;
  auto neg = h.model->Forward(*h.e, bad.data(), tgt.data(), 1, c.seq_len, nullptr);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("an input token"), absl::string_view::npos) << neg.status();

  const HfParam& wte = h.model->hf_params()[0];
  size_t n = 1;
  for (int64_t d : wte.shape) n *= size_t(d);
  ASSERT_TRUE(h.e->SetParam(wte.unit, wte.param, std::vector<float>(n, INFINITY)).ok());
  auto diverged = h.model->Forward(*h.e, in.data(), tgt.data(), 1, c.seq_len, nullptr);
  ASSERT_FALSE(diverged.ok());
  EXPECT_TRUE(IsDivergence(diverged.status())) << diverged.status();
  EXPECT_NE(diverged.status().message().find("training diverged"), absl::string_view::npos) << diverged.status();
  EXPECT_EQ(diverged.status().message().find("outside the vocabulary"), absl::string_view::npos);
  ASSERT_TRUE(h.e->BeginMicroBatch().ok());
  EXPECT_TRUE(IsDivergence(h.model->TrainMicroBatch(*h.e, in.data(), tgt.data(), 1, 1.0f, false).status()));
}

TEST(GptModel, LogitsAtPositionTDoNotDependOnLaterTokens) {
  const GptConfig c = Tiny();
  Harness h(c);
  std::vector<int32_t> a = Tokens(c.seq_len, c.vocab, 1);
  for (int t = 1; t < c.seq_len; ++t) {
    std::vector<int32_t> b = a;
    for (int j = t; j < c.seq_len; ++j) b[j] = (b[j] + 3) % c.vocab;  // change only the future of t-1
    std::vector<float> full_a, full_b, truncated;
    ASSERT_TRUE(h.model->Forward(*h.e, a.data(), nullptr, 1, c.seq_len, &full_a, t - 1).ok());
    ASSERT_TRUE(h.model->Forward(*h.e, b.data(), nullptr, 1, c.seq_len, &full_b, t - 1).ok());
    ASSERT_TRUE(h.model->Forward(*h.e, a.data(), nullptr, 1, t, &truncated).ok());
    bool changed_future_matters = false;
    for (int v = 0; v < c.vocab; ++v) {
      EXPECT_NEAR(full_a[v], full_b[v], 1e-6) << "position " << t - 1 << " sees later tokens (v " << v << ")";
      EXPECT_NEAR(full_a[v], truncated[v], 1e-5) << "position " << t - 1 << ": T=" << c.seq_len << " vs T=" << t;
      changed_future_matters |= full_a[v] != full_b[v];
    }
    EXPECT_FALSE(changed_future_matters);
  }
  // Sanity: the logits do depend on the past.
  std::vector<int32_t> b = a;
  b[0] = (b[0] + 1) % c.vocab;
  std::vector<float> la, lb;
  ASSERT_TRUE(h.model->Forward(*h.e, a.data(), nullptr, 1, c.seq_len, &la).ok());
  ASSERT_TRUE(h.model->Forward(*h.e, b.data(), nullptr, 1, c.seq_len, &lb).ok());
  EXPECT_NE(la, lb);
}

TEST(GptModel, GradientsMatchFiniteDifferences) {
  const GptConfig c = Tiny();
  engine::EngineConfig ec;
  ec.stage = 0;
  ec.gradient_accumulation_steps = 2;
  auto comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
  auto e = std::move(engine::Engine::Create(ec, *comms[0], dev)).value();
  GptModel model = std::move(GptModel::Register(*e, c)).value();
  ASSERT_TRUE(e->Finalize().ok());
  const int B = 2;
  const std::vector<int32_t> in = Tokens(B * c.seq_len, c.vocab, 5), tgt = Tokens(B * c.seq_len, c.vocab, 6);
  ASSERT_TRUE(e->BeginMicroBatch().ok());
  ASSERT_TRUE(model.TrainMicroBatch(*e, in.data(), tgt.data(), B, 1.0f, false).ok());
  ASSERT_TRUE(e->EndMicroBatch().ok());
  std::mt19937 rng(9);
  int checked = 0;
  for (const HfParam& p : model.hf_params()) {
    std::vector<float> value = e->GatherParam(p.unit, p.param).value();
    const float* grad = e->Grad(p.unit, p.param);
    for (int k = 0; k < 3; ++k) {
      const size_t i = rng() % value.size();
      const float h = 1e-2f, orig = value[i];
      double f[2];
      for (int s = 0; s < 2; ++s) {
        value[i] = orig + (s ? -h : h);
        ASSERT_TRUE(e->SetParam(p.unit, p.param, value).ok());
        f[s] = model.Forward(*e, in.data(), tgt.data(), B, c.seq_len, nullptr).value();
      }
      value[i] = orig;
      ASSERT_TRUE(e->SetParam(p.unit, p.param, value).ok());
      const double numeric = (f[0] - f[1]) / (2 * h);
      // fp32 losses differenced over h = 1e-2 (about 2e-6 absolute noise); the O(h^2) curvature term is a
      // few percent for the small-scale embeddings.
      EXPECT_NEAR(grad[i], numeric, 5e-6 + 5e-2 * std::fabs(numeric)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(model.hf_params().size()));
}

TEST(GptModel, ActivationCheckpointingGivesIdenticalGradients) {
  const GptConfig c = Tiny();
  const int B = 3;
  const std::vector<int32_t> in = Tokens(B * c.seq_len, c.vocab, 7), tgt = Tokens(B * c.seq_len, c.vocab, 8);
  std::vector<std::vector<float>> g[2];
  for (int ckpt = 0; ckpt < 2; ++ckpt) {
    engine::EngineConfig ec;
    ec.stage = 0;
    ec.gradient_accumulation_steps = 2;
    auto comms = comm::CreateInProcessGroup(1, comm::Options{});
    device::HostDevice dev;
    auto e = std::move(engine::Engine::Create(ec, *comms[0], dev)).value();
    GptModel model = std::move(GptModel::Register(*e, c)).value();
    ASSERT_TRUE(e->Finalize().ok());
    ASSERT_TRUE(e->BeginMicroBatch().ok());
    ASSERT_TRUE(model.TrainMicroBatch(*e, in.data(), tgt.data(), B, 1.0f, ckpt == 1).ok());
    ASSERT_TRUE(e->EndMicroBatch().ok());
    for (const HfParam& p : model.hf_params()) {
      const float* d = e->Grad(p.unit, p.param);
      g[ckpt].emplace_back(d, d + e->layout(p.unit).params[p.param].numel);
    }
  }
  ASSERT_EQ(g[0].size(), g[1].size());
  for (size_t i = 0; i < g[0].size(); ++i) EXPECT_EQ(g[0][i], g[1][i]) << "parameter #" << i;
}

}  // namespace
}  // namespace strata::gpt
