// The optimizer loops against double-precision references of torch.optim.AdamW / SGD, the schedules at
// their defining points, and clipping.
#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The loop ApplyUpdate ran before the fused kernels: the scalar element math, element by element.
void ElementLoop(const OptimizerConfig& cfg, const ShardState& s, const std::vector<shard::Segment>& segs, double lr,
                 int64_t step, float grad_scale) {
  const bool w = cfg.adam_w_mode;
  const kernels::AdamWStep decay =
      kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step, w);
  const kernels::AdamWStep no_decay = kernels::MakeAdamWStep(lr, cfg.beta1, cfg.beta2, cfg.eps, 0.0, step, w);
  const kernels::SgdStep sd{static_cast<float>(lr), static_cast<float>(cfg.momentum),
                            static_cast<float>(cfg.weight_decay)};
  const kernels::SgdStep snd{static_cast<float>(lr), static_cast<float>(cfg.momentum), 0.0f};
  for (const shard::Segment& seg : segs) {
    for (size_t i = seg.begin; i < seg.end; ++i) {
      if (cfg.type == OptimizerType::kAdamW) {
        kernels::AdamWElement(s.grad[i] * grad_scale, s.master[i], s.m[i], s.v[i], seg.weight_decay ? decay : no_decay);
      } else {
        kernels::SgdElement(s.grad[i] * grad_scale, s.master[i], s.m[i], seg.weight_decay ? sd : snd);
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
  const std::vector<shard::Segment> segs = {{0, 70001, 0, true}, {70001, 70002, 1, false}, {70010, 199990, 2, true}};
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
          ElementLoop(cfg, ShardState{pr.data(), g.data(), mr.data(), vr.data()}, segs, 1e-2 / t, t, 0.8f);
          UpdateOptions o{copy.data(), DType::kBF16, exec->get()};
          ApplyUpdate(cfg, ShardState{p.data(), g.data(), m.data(), v.data()}, segs, 1e-2 / t, t, 0.8f, o);
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

TEST(SumSquares, AccumulatesInDouble) {
  std::vector<float> x(1000001, 1e-3f);
  x[0] = 1000.0f;
  EXPECT_NEAR(SumSquares(x.data(), x.size()), 1e6 + 1e6 * 1e-6, 1e-3);
}

}  // namespace
}  // namespace strata::optim
