// The optimizer loops against double-precision references of torch.optim.AdamW / SGD, the schedules at
// their defining points, and clipping.
#include "runtime/optim/optimizer.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::optim {
namespace {

// torch.optim.AdamW for one element, in double.
void AdamWRef(double g, double& p, double& m, double& v, double lr, double b1, double b2, double eps, double wd,
              int t) {
  p *= 1 - lr * wd;
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
  p -= lr * mhat / (std::sqrt(vhat) + eps);
}

TEST(ApplyUpdate, AdamWTracksDoubleReferenceAndSkipsDecayWhereFlagged) {
  OptimizerConfig cfg;
  cfg.lr = 3e-3;
  cfg.weight_decay = 0.1;
  const size_t n = 37;
  std::vector<float> p(n), g(n), m(n, 0), v(n, 0);
  std::vector<double> pd(n), md(n, 0), vd(n, 0);
  for (size_t i = 0; i < n; ++i) pd[i] = p[i] = 0.5f - 0.03f * i;
  // Elements [0, 20) decay, [20, 30) do not, [30, 37) are padding (never touched).
  const std::vector<shard::Segment> segs = {{0, 20, 0, true}, {20, 30, 1, false}};
  for (int t = 1; t <= 50; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.3f * i + 0.7f * t);
    ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, cfg.lr, t, 1.0f);
    for (size_t i = 0; i < 30; ++i) {
      AdamWRef(g[i], pd[i], md[i], vd[i], cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, i < 20 ? 0.1 : 0.0, t);
    }
  }
  for (size_t i = 0; i < 30; ++i) {
    // fp32 arithmetic over 50 steps: the update is ~lr per step; allow 1e-6 absolute.
    EXPECT_NEAR(p[i], pd[i], 1e-6) << "index " << i;
  }
  for (size_t i = 30; i < n; ++i) EXPECT_EQ(p[i], 0.5f - 0.03f * i) << "padding index " << i << " was updated";
}

TEST(ApplyUpdate, GradScaleMultipliesTheGradient) {
  OptimizerConfig cfg;
  cfg.type = OptimizerType::kSgd;
  cfg.lr = 0.5;
  std::vector<float> p = {1, 1}, g = {2, 4}, buf = {0, 0};
  ApplyUpdate(cfg, ShardState{p.data(), g.data(), buf.data(), nullptr}, {{0, 2, 0, false}}, cfg.lr, 1, 0.25f);
  EXPECT_FLOAT_EQ(p[0], 1 - 0.5f * 0.5f);
  EXPECT_FLOAT_EQ(p[1], 1 - 0.5f * 1.0f);
}

TEST(ApplyUpdate, SgdMomentumMatchesTorchRecurrence) {
  OptimizerConfig cfg;
  cfg.type = OptimizerType::kSgd;
  cfg.lr = 0.1;
  cfg.momentum = 0.9;
  cfg.weight_decay = 0.01;
  std::vector<float> p = {2.0f}, g = {0}, buf = {0};
  double pd = 2.0, bd = 0;
  for (int t = 1; t <= 10; ++t) {
    g[0] = 0.5f * t;
    ApplyUpdate(cfg, ShardState{p.data(), g.data(), buf.data(), nullptr}, {{0, 1, 0, true}}, cfg.lr, t, 1.0f);
    const double gd = 0.5 * t + 0.01 * pd;
    bd = t == 1 ? gd : 0.9 * bd + gd;
    pd -= 0.1 * bd;
  }
  EXPECT_NEAR(p[0], pd, 1e-5);
}

TEST(ClipCoefficient, MatchesTorchClipGradNorm) {
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(ClipCoefficient(5.0, 0.0), 1.0f) << "0 = off";
  EXPECT_FLOAT_EQ(ClipCoefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(ClipCoefficient(NAN, 1.0), 1.0f) << "non-finite norms are handled by the step, not by clipping";
}

TEST(ScheduledLr, WarmupThenDecayHitsItsEndpoints) {
  SchedulerConfig s;
  EXPECT_EQ(ScheduledLr(s, 1e-3, 123), 1e-3) << "constant";
  s.type = LrScheduleType::kWarmupLinear;
  s.warmup_steps = 10;
  s.warmup_min_lr = 0;
  s.total_steps = 110;
  s.min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 0), 1e-4);   // first step: 1/10 of the way up
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 9), 1e-3);   // end of warm-up
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 60), 1e-4 + 0.9e-3 * 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 110), 1e-4);
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 500), 1e-4) << "stays at the floor";
  s.type = LrScheduleType::kWarmupCosine;
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 60), 1e-4 + 0.9e-3 * 0.5);  // cosine midpoint = linear midpoint
  EXPECT_NEAR(ScheduledLr(s, 1e-3, 35), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  s.total_steps = 0;
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 1000), 1e-3) << "no horizon: warm-up then constant";
}

TEST(SumSquares, AccumulatesInDouble) {
  std::vector<float> x(1000001, 1e-3f);
  x[0] = 1000.0f;
  EXPECT_NEAR(SumSquares(x.data(), x.size()), 1e6 + 1e6 * 1e-6, 1e-3);
}

}  // namespace
}  // namespace strata::optim
