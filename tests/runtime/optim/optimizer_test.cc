// The optimizer loops against double-precision references of torch.optim.AdamW / SGD, the schedules at
// their defining points, and clipping.
#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"

namespace strata::optim {
namespace {

// torch.optim.AdamW for one element, in double; with decoupled false, torch.optim.Adam with weight_decay (L2:
// the decay joins the gradient), DeepSpeed's Adam with adam_w_mode false.
void AdamWRef(double g, double& p, double& m, double& v, double lr, double b1, double b2, double eps, double wd,
              int t, bool decoupled = true) {
  if (decoupled) {
    p *= 1 - lr * wd;
  } else {
    g += wd * p;
  }
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

TEST(ApplyUpdate, AdamWithoutAdamWModeAddsTheDecayToTheGradient) {
  OptimizerConfig cfg;
  cfg.lr = 3e-3;
  cfg.weight_decay = 0.5;
  cfg.adam_w_mode = false;
  const size_t n = 30;
  std::vector<float> p(n), g(n), m(n, 0), v(n, 0);
  std::vector<double> pd(n), md(n, 0), vd(n, 0), pw(n);
  for (size_t i = 0; i < n; ++i) pw[i] = pd[i] = p[i] = 0.5f - 0.03f * i;
  const std::vector<shard::Segment> segs = {{0, 20, 0, true}, {20, 30, 1, false}};
  double mw = 0, vw = 0;
  for (int t = 1; t <= 50; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.3f * i + 0.7f * t);
    ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, cfg.lr, t, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      AdamWRef(g[i], pd[i], md[i], vd[i], cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, i < 20 ? 0.5 : 0.0, t, false);
    }
    AdamWRef(g[0], pw[0], mw, vw, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, 0.5, t);
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-6) << "index " << i;
  EXPECT_GT(std::fabs(pw[0] - pd[0]), 1e-4) << "L2 and decoupled decay must differ for this test to mean anything";
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

// The loop ApplyUpdate ran before the fused kernels: the scalar element math, element by element, with each
// segment's group's lr and decay (Note [Param groups]) built here from the hyper-parameters.
void ElementLoop(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs,
                 const std::vector<GroupHyper>& groups, int64_t step, float grad_scale) {
  const bool w = cfg.adam_w_mode;
  for (const shard::Segment& seg : segs) {
    const GroupHyper& g = groups[seg.group];
    const double wd = seg.weight_decay ? g.weight_decay : 0.0;
    const kernels::AdamWStep a =
        kernels::MakeAdamWStep(g.lr, cfg.beta1, cfg.beta2, cfg.eps, wd, seg.step > 0 ? seg.step : step, w);
    const kernels::SgdStep sgd{static_cast<float>(g.lr), static_cast<float>(cfg.momentum), static_cast<float>(wd)};
    for (size_t i = seg.begin; i < seg.end; ++i) {
      if (cfg.type == OptimizerType::kAdamW) {
        kernels::AdamWElement(s.grad[i] * grad_scale, s.master[i], s.m[i], s.v[i], a);
      } else {
        kernels::SgdElement(s.grad[i] * grad_scale, s.master[i], s.m[i], sgd);
      }
    }
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b, size_t* where) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *where = i;
      return false;
    }
  }
  return true;
}

// Every kernel variant this CPU has and several thread counts give the element loop's bits, step after
// step, for both optimizers, with the bf16 copy written in the same pass (the engine's fp32 results
// therefore do not change with the fused kernels).
TEST(ApplyUpdate, EveryVariantAndThreadCountIsBitIdenticalToTheElementLoop) {
  const size_t n = 200003;
  // Two param groups (Note [Param groups]); the last segment in the second, with a step count of its own.
  std::vector<shard::Segment> segs = {{0, 70001, 0, true}, {70001, 70002, 1, false}, {70010, 199990, 2, true}};
  segs[2].group = 1;
  segs[2].step = 2;
  for (const int kind : {0, 1, 2}) {  // AdamW, Adam with L2 (adam_w_mode false), SGD
    const OptimizerType type = kind == 2 ? OptimizerType::kSgd : OptimizerType::kAdamW;
    OptimizerConfig cfg;
    cfg.type = type;
    cfg.adam_w_mode = kind != 1;
    cfg.weight_decay = 0.05;
    cfg.momentum = 0.9;
    for (const char* isa : {"scalar", "avx2", "avx512", "avx512bf16"}) {
      for (int threads : {1, 2, 3}) {
        auto exec = HostExecutor::Create(threads, isa);
        if (!exec.ok()) continue;  // this CPU lacks the variant (host_executor_test covers the error)
        std::vector<float> p(n), g(n), m(n, 0), v(n, 0), pr, mr, vr;
        std::vector<uint16_t> copy(n, 0);
        for (size_t i = 0; i < n; ++i) p[i] = std::cos(0.001f * i);
        pr = p, mr = m, vr = v;
        for (int t = 1; t <= 4; ++t) {
          for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * i + t);
          const std::vector<GroupHyper> groups = {{1e-2 / t, 0.05}, {3e-2 / t, 0.2}};
          ElementLoop(cfg, ShardState{pr.data(), g.data(), mr.data(), vr.data()}, segs, groups, t, 0.8f);
          UpdateOptions o{copy.data(), DType::kBF16, exec->get()};
          ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, groups, t, 0.8f, o);
        }
        const std::string what = std::string(isa) + " threads=" + std::to_string(threads) +
                                 (kind == 0 ? " adamw" : kind == 1 ? " adam-l2" : " sgd");
        size_t at = 0;
        EXPECT_TRUE(SameBits(pr, p, &at)) << what << ": master differs at " << at << ": " << pr[at] << " vs " << p[at];
        EXPECT_TRUE(SameBits(mr, m, &at)) << what << ": m differs at " << at;
        EXPECT_TRUE(SameBits(vr, v, &at)) << what << ": v differs at " << at;
        for (const shard::Segment& seg : segs) {
          for (size_t i = seg.begin; i < seg.end; ++i) {
            ASSERT_EQ(copy[i], kernels::FloatToBf16(p[i])) << what << " bf16 copy at " << i;
          }
        }
        EXPECT_EQ(copy[70005], 0) << what << ": param copy written outside the segments";
      }
    }
  }
}

// Note [Param groups]: each segment takes its group's lr and decay, for AdamW, Adam with L2 and SGD, against
// double references of torch.optim.AdamW / Adam / SGD with those param groups. Group 0 (the config's) has a
// decaying and a non-decaying segment, group 1 a decaying one with another lr and decay, group 2 lr 0.
TEST(ApplyUpdate, EachSegmentTakesItsGroupsLrAndWeightDecay) {
  const std::vector<GroupHyper> groups = {{3e-3, 0.1}, {2e-2, 0.5}, {0.0, 0.3}};
  std::vector<shard::Segment> segs = {{0, 10, 0, true}, {10, 20, 1, false}, {20, 35, 2, true}, {40, 50, 3, true}};
  segs[2].group = 1;
  segs[3].group = 2;
  auto wd_of = [&](size_t i) { return i < 10 ? 0.1 : i < 20 ? 0.0 : i < 35 ? 0.5 : i < 40 ? -1.0 : 0.3; };
  auto lr_of = [&](size_t i) { return i < 20 ? 3e-3 : i < 35 ? 2e-2 : 0.0; };
  for (const int kind : {0, 1, 2}) {  // AdamW, Adam with L2 (adam_w_mode false), SGD with momentum
    OptimizerConfig cfg;
    cfg.type = kind == 2 ? OptimizerType::kSgd : OptimizerType::kAdamW;
    cfg.adam_w_mode = kind != 1;
    cfg.momentum = 0.9;
    cfg.lr = 7.0;  // not read: the groups' values are
    cfg.weight_decay = 9.0;
    const size_t n = 50;
    std::vector<float> p(n), g(n), m(n, 0), v(n, 0);
    std::vector<double> pd(n), md(n, 0), vd(n, 0);
    for (size_t i = 0; i < n; ++i) pd[i] = p[i] = 0.5f - 0.02f * i;
    for (int t = 1; t <= 30; ++t) {
      for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.3f * i + 0.7f * t);
      ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, groups, t, 1.0f);
      for (size_t i = 0; i < n; ++i) {
        if (wd_of(i) < 0) continue;  // [35, 40): padding
        if (kind == 2) {             // torch.optim.SGD: g += wd p; buf = mu buf + g (buf = g at t 1); p -= lr buf
          const double gd = g[i] + wd_of(i) * pd[i];
          md[i] = t == 1 ? gd : 0.9 * md[i] + gd;
          pd[i] -= lr_of(i) * md[i];
        } else {
          AdamWRef(g[i], pd[i], md[i], vd[i], lr_of(i), cfg.beta1, cfg.beta2, cfg.eps, wd_of(i), t, kind == 0);
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (wd_of(i) < 0) {
        EXPECT_EQ(p[i], 0.5f - 0.02f * i) << "padding index " << i << " was updated";
      } else {
        EXPECT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << "kind " << kind << " index " << i;
      }
    }
    for (size_t i = 40; i < 50; ++i) EXPECT_EQ(p[i], 0.5f - 0.02f * i) << "lr 0 moved index " << i;
    EXPECT_GT(std::fabs(p[25] - p[5]), 0.0f);
  }
}

// A group's segments get exactly the bits of an update with one group, the config's, whose lr and decay are
// that group's: per-segment coefficients are the config's coefficients, built per group.
TEST(ApplyUpdate, AGroupsSegmentsGetTheBitsOfAConfigWithItsValues) {
  for (const int kind : {0, 1, 2}) {
    OptimizerConfig cfg;
    cfg.type = kind == 2 ? OptimizerType::kSgd : OptimizerType::kAdamW;
    cfg.adam_w_mode = kind != 1;
    cfg.momentum = 0.8;
    const std::vector<GroupHyper> groups = {{1e-3, 0.01}, {4e-2, 0.25}};
    std::vector<shard::Segment> segs = {{0, 300, 0, true}, {300, 700, 1, true}, {700, 900, 1, false}};
    for (size_t k = 1; k < 3; ++k) segs[k].group = 1;
    const size_t n = 900;
    std::vector<float> p(n), g(n), m(n, 0), v(n, 0);
    for (size_t i = 0; i < n; ++i) p[i] = std::cos(0.01f * i);
    std::vector<float> pr = p, mr = m, vr = v;
    for (int t = 1; t <= 5; ++t) {
      for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * i + t);
      ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, groups, t, 0.5f);
      for (size_t k = 0; k < segs.size(); ++k) {  // each segment alone, with its group's values as the config's
        OptimizerConfig one = cfg;
        one.lr = groups[segs[k].group].lr;
        one.weight_decay = groups[segs[k].group].weight_decay;
        shard::Segment alone = segs[k];
        alone.group = 0;
        ApplyUpdate(one, ShardState{pr.data(), g.data(), mr.data(), vr.data()}, {alone}, one.lr, t, 0.5f);
      }
    }
    size_t at = 0;
    EXPECT_TRUE(SameBits(pr, p, &at)) << "kind " << kind << ": master differs at " << at;
    EXPECT_TRUE(SameBits(mr, m, &at)) << "kind " << kind << ": m differs at " << at;
    EXPECT_TRUE(SameBits(vr, v, &at)) << "kind " << kind << ": v differs at " << at;
  }
}

TEST(ApplyUpdate, WritesAnFp16CopyAndNoCopyForF32) {
  OptimizerConfig cfg;
  std::vector<float> p = {1.0f, -2.0f, 3.0f}, g = {0.1f, 0.2f, 0.3f}, m(3, 0), v(3, 0);
  std::vector<uint16_t> copy(3, 7);
  const std::vector<shard::Segment> segs = {{0, 3, 0, false}};
  ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, 1e-3, 1, 1.0f,
              UpdateOptions{copy.data(), DType::kF32, nullptr});
  EXPECT_EQ(copy, std::vector<uint16_t>(3, 7)) << "kF32 means no copy";
  ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, 1e-3, 2, 1.0f,
              UpdateOptions{copy.data(), DType::kF16, nullptr});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(copy[i], kernels::FloatToHalf(p[i]));
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

// DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR as its engine drives them (the oracle: the classes of
// deepspeed/runtime/lr_schedules.py restated, with last_batch_iteration starting at -1 and step() after each
// update). lr_of_update[k] is the lr of the k-th update (0-based).
std::vector<double> DeepSpeedLrs(LrScheduleType type, bool log, double min_lr, double max_lr, int warmup, int total,
                                 double warmup_min_ratio, double cos_min_ratio, int updates) {
  const int w = std::max(2, warmup);
  const double inverse_log_warm_up = 1.0 / std::log(double(w));
  int last = -1;
  auto get_lr = [&]() -> double {
    if (type == LrScheduleType::kWarmupCosineLR) {
      if (last < 0) return 0.0;
      double ratio;
      if (last < w) {
        ratio = log ? inverse_log_warm_up * std::log(last + 1) : double(last) / w;
        return max_lr * (warmup_min_ratio + ratio * (1. - warmup_min_ratio));
      }
      const double real_last_step = last - w + 1, real_total_steps = std::max(1, total - w);
      const double progress = std::min(1.0, real_last_step / real_total_steps);
      ratio = (1 + std::cos(M_PI * progress)) / 2;
      return max_lr * std::max(0.0, cos_min_ratio + (1. - cos_min_ratio) * ratio);
    }
    if (last < 0) return min_lr;
    double gamma = 1.0;
    if (last < w) {
      gamma = log ? inverse_log_warm_up * std::log(last + 1) : double(last) / w;
    } else if (type == LrScheduleType::kWarmupDecayLR) {
      gamma = std::max(0.0, double(total - last) / double(std::max(1, total - w)));
    }
    return min_lr + (max_lr - min_lr) * gamma;
  };
  std::vector<double> lrs;
  for (int k = 0; k < updates; ++k) {
    lrs.push_back(get_lr());  // the optimizer's lr for this update
    ++last;                   // engine: lr_scheduler.step() after the update
  }
  return lrs;
}

TEST(ScheduledLr, DeepSpeedSchedulesMatchTheirFormulaAtEveryStep) {
  for (const LrScheduleType type :
       {LrScheduleType::kWarmupLR, LrScheduleType::kWarmupDecayLR, LrScheduleType::kWarmupCosineLR}) {
    for (const bool log : {true, false}) {
      for (const int warmup : {1, 2, 7, 50}) {
        SchedulerConfig s;
        s.type = type;
        s.log_warmup = log;
        s.warmup_steps = warmup;
        s.total_steps = 120;
        s.warmup_min_lr = type == LrScheduleType::kWarmupCosineLR ? 0 : 2e-5;
        s.warmup_min_ratio = 0.1;
        s.cos_min_ratio = 0.05;
        const std::vector<double> want = DeepSpeedLrs(type, log, 2e-5, 3e-4, warmup, 120, 0.1, 0.05, 200);
        for (int step = 0; step < 200; ++step) {
          EXPECT_NEAR(ScheduledLr(s, 3e-4, step), want[step], 1e-12 * 3e-4)
              << "type " << int(type) << " log " << log << " warmup " << warmup << " step " << step;
        }
      }
    }
  }
}

// Numbers written out from DeepSpeed's documented formula: WarmupLR with the default "log" warm-up over 10
// steps from 0 to 1e-3. The first two updates run at warmup_min_lr, then ln(i + 1) / ln(10) of the way up.
TEST(ScheduledLr, WarmupLRDefaultsToALogarithmicWarmUp) {
  SchedulerConfig s;
  s.type = LrScheduleType::kWarmupLR;
  s.warmup_steps = 10;
  const double expected[] = {0, 0, 1e-3 * std::log(2) / std::log(10), 1e-3 * std::log(3) / std::log(10),
                             1e-3 * std::log(4) / std::log(10)};
  for (int step = 0; step < 5; ++step) EXPECT_NEAR(ScheduledLr(s, 1e-3, step), expected[step], 1e-18) << step;
  EXPECT_NEAR(ScheduledLr(s, 1e-3, 10), 1e-3 * std::log(10) / std::log(10), 1e-18);
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 11), 1e-3);
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 5000), 1e-3);
  s.log_warmup = false;
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1e-3, 3), 1e-3 * 2 / 10);  // linear: i / W with i = step - 1
}

// Note [Param groups]: a param group's lr under each schedule, DeepSpeed's rule: no scheduler and Strata's
// own schedules take the group's lr; WarmupCosineLR the group's lr times the ratio (org_lr * ratio);
// WarmupLR the group's lr as its peak, unless warmup_max_lr is given (shared_peak), as WarmupDecayLR always
// is: then every group follows the config's peak. Against the oracle DeepSpeedLrs with each group's values.
TEST(GroupLr, FollowsDeepSpeedsRuleForEverySchedule) {
  const double config_lr = 3e-4, own = 5e-3;
  for (const LrScheduleType type : {LrScheduleType::kConstant, LrScheduleType::kWarmupLR,
                                    LrScheduleType::kWarmupDecayLR, LrScheduleType::kWarmupCosineLR}) {
    for (const bool shared : {false, true}) {
      if ((type == LrScheduleType::kWarmupDecayLR) != shared && type != LrScheduleType::kWarmupLR) continue;
      SchedulerConfig s;
      s.type = type;
      s.warmup_steps = 7;
      s.total_steps = 40;
      s.warmup_min_lr = type == LrScheduleType::kWarmupCosineLR ? 0 : 1e-5;
      s.warmup_min_ratio = 0.1;
      s.cos_min_ratio = 0.05;
      s.shared_peak = shared;
      const double peak = shared ? config_lr : own;
      const std::vector<double> want = type == LrScheduleType::kConstant
                                           ? std::vector<double>(60, own)
                                           : DeepSpeedLrs(type, true, 1e-5, peak, 7, 40, 0.1, 0.05, 60);
      const std::vector<double> config_want = type == LrScheduleType::kConstant
                                                  ? std::vector<double>(60, config_lr)
                                                  : DeepSpeedLrs(type, true, 1e-5, config_lr, 7, 40, 0.1, 0.05, 60);
      for (int step = 0; step < 60; ++step) {
        EXPECT_NEAR(GroupLr(s, config_lr, own, step), want[step], 1e-12 * own)
            << "type " << int(type) << " shared " << shared << " step " << step;
        EXPECT_EQ(GroupLr(s, config_lr, std::nullopt, step), ScheduledLr(s, config_lr, step));
        EXPECT_NEAR(GroupLr(s, config_lr, std::nullopt, step), config_want[step], 1e-12 * config_lr);
      }
      if (!shared && type != LrScheduleType::kConstant) {
        EXPECT_NE(GroupLr(s, config_lr, own, 20), GroupLr(s, config_lr, std::nullopt, 20)) << int(type);
      }
    }
  }
  SchedulerConfig linear;  // Strata's own: the group's lr is its peak, warmup_min_lr and min_lr shared
  linear.type = LrScheduleType::kWarmupLinear;
  linear.warmup_steps = 10;
  linear.total_steps = 110;
  linear.min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(GroupLr(linear, 1e-3, 2e-3, 9), 2e-3);
  EXPECT_DOUBLE_EQ(GroupLr(linear, 1e-3, 2e-3, 60), 1e-4 + (2e-3 - 1e-4) * 0.5);
  EXPECT_DOUBLE_EQ(GroupLr(linear, 1e-3, std::nullopt, 60), ScheduledLr(linear, 1e-3, 60));
}

TEST(SumSquares, AccumulatesInDouble) {
  std::vector<float> x(1000001, 1e-3f);
  x[0] = 1000.0f;
  EXPECT_NEAR(SumSquares(x.data(), x.size()), 1e6 + 1e6 * 1e-6, 1e-3);
}

}  // namespace
}  // namespace strata::optim
