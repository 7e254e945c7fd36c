// The trainer's bring-up and micro-batch loop (models/gpt/train/trainer.h), which `strata train`,
// `bench step` and `bench capacity` share: the loop gives the bits of the protocol written out by hand
// (loss, parameters after the step), hands each micro-batch's loss scale through, stops at the first error
// and returns it as it is; a model over the budgets fails bring-up with Finalize's ResourceExhausted.
#include "models/gpt/train/trainer.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"

namespace strata::tools {
namespace {

gpt::GptConfig Tiny() { return gpt::GptConfig{2, 16, 2, 8, 11}; }

engine::EngineConfig Config() {
  engine::EngineConfig ec;
  ec.optimizer.lr = 1e-2;
  ec.gradient_accumulation_steps = 3;
  return ec;
}

std::vector<int32_t> Tokens(int n, int vocab, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

struct World {
  std::vector<std::unique_ptr<comm::Communicator>> comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
};

TEST(Trainer, TheLoopGivesTheBitsOfTheProtocolWrittenOut) {
  const gpt::GptConfig c = Tiny();
  const int B = 2, count = 3;
  std::vector<std::vector<int32_t>> in, tgt;
  for (int a = 0; a < count; ++a) {
    in.push_back(Tokens(B * c.seq_len, c.vocab, 10 + a));
    tgt.push_back(Tokens(B * c.seq_len, c.vocab, 20 + a));
  }
  World w1, w2;
  auto looped = BringUp(Config(), c, *w1.comms[0], w1.dev);
  auto by_hand = BringUp(Config(), c, *w2.comms[0], w2.dev);
  ASSERT_TRUE(looped.ok()) << looped.status();
  ASSERT_TRUE(by_hand.ok()) << by_hand.status();

  std::vector<int> asked;
  auto loss = RunMicroBatches(*looped, count, B, false, [&](int a) -> absl::StatusOr<MicroBatchInput> {
    asked.push_back(a);
    return MicroBatchInput{in[a].data(), tgt[a].data(), 1.0f};
  });
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(asked, (std::vector<int>{0, 1, 2}));

  engine::Engine& e = *by_hand->engine;
  double expected = 0;
  for (int a = 0; a < count; ++a) {
    ASSERT_TRUE(e.BeginMicroBatch().ok());
    auto l = by_hand->model.TrainMicroBatch(e, in[a].data(), tgt[a].data(), B, 1.0f, false);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_TRUE(e.EndMicroBatch().ok());
    expected += *l / count;
  }
  EXPECT_EQ(*loss, expected);  // bit for bit: the same sum in the same order
  EXPECT_TRUE(std::isfinite(*loss));
  ASSERT_TRUE(looped->engine->Step().ok());
  ASSERT_TRUE(e.Step().ok());
  auto p1 = looped->engine->GatherAllParams();
  auto p2 = e.GatherAllParams();
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_EQ(*p1, *p2);
}

TEST(Trainer, TheLoopHandsTheLossScaleThroughAndStopsAtTheFirstError) {
  const gpt::GptConfig c = Tiny();
  const std::vector<int32_t> in = Tokens(c.seq_len, c.vocab, 1), tgt = Tokens(c.seq_len, c.vocab, 2);
  World w;
  auto run = BringUp(Config(), c, *w.comms[0], w.dev);
  ASSERT_TRUE(run.ok()) << run.status();
  // A NaN loss scale is how `strata train --inject-nonfinite-step` poisons a step: its gradients turn
  // non-finite and the engine skips the step, which it can only do if the scale reached TrainMicroBatch.
  auto loss = RunMicroBatches(*run, 3, 1, false, [&](int a) -> absl::StatusOr<MicroBatchInput> {
    return MicroBatchInput{in.data(), tgt.data(), a == 0 ? NAN : 1.0f};
  });
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto r = run->engine->Step();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped);

  int calls = 0;
  auto failed = RunMicroBatches(*run, 3, 1, false, [&](int a) -> absl::StatusOr<MicroBatchInput> {
    ++calls;
    if (a == 1) return absl::DataLossError("token file truncated");
    return MicroBatchInput{in.data(), tgt.data(), 1.0f};
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(failed.status(), absl::DataLossError("token file truncated"));

  std::vector<int32_t> bad = tgt;
  bad[3] = c.vocab;  // outside the vocabulary: TrainMicroBatch's own error, returned as it is
  World w2;
  auto fresh = BringUp(Config(), c, *w2.comms[0], w2.dev);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto oov = RunMicroBatches(*fresh, 1, 1, false, [&](int) -> absl::StatusOr<MicroBatchInput> {
    return MicroBatchInput{in.data(), bad.data(), 1.0f};
  });
  ASSERT_FALSE(oov.ok());
  EXPECT_EQ(oov.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(oov.status().message().find("outside the vocabulary"), absl::string_view::npos) << oov.status();
}

TEST(Trainer, BringUpOverTheBudgetsIsResourceExhausted) {
  engine::EngineConfig ec = Config();
  ec.device_budget_bytes = 1024;  // far below the tiny GPT's parameters, gradients and optimizer state
  World w;
  auto run = BringUp(ec, Tiny(), *w.comms[0], w.dev);
  ASSERT_FALSE(run.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(run.status())) << run.status();
}

}  // namespace
}  // namespace strata::tools
