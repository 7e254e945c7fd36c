// optim::MemoryState and optim::RunOptimizerStep without an engine: the memory-resident store reads,
// writes and edits each kind (in place where the CPU reaches it, staged where it does not), and its
// step gives the bits of one ApplyUpdate over the same range (AdamW with a bf16 param copy, SGD with
// the fp32 master kept apart and as the param storage itself). The step over the store scales the
// gradients, sums their squares in unit order, takes the norm across ranks, clips, updates last to
// first and skips everything on a non-finite norm, bit for bit against a hand-written reference.
// LossScaler follows DeepSpeed's DynamicLossScaler (hysteresis, window, the minimum) step for step.
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "runtime/optim/loss_scale.h"
#include "runtime/optim/memory_state.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/step.h"
#include "runtime/optim/tier_update.h"
#include "tests/runtime/memory/hooked_tier_ops.h"

namespace strata::optim {
namespace {

std::vector<float> Values(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 1009) + offset;
  return v;
}

memory::Buffer Floats(memory::Allocator& a, size_t n) {
  auto b = a.Allocate(n * 4, memory::Kind::kOptimizerState);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : memory::Buffer{};
}

// Parameter storage of one unit as host bytes, which the storage hands out in place.
struct Params {
  std::vector<char> bytes;
  ParamsAccess Access() {
    static const std::unique_ptr<memory::TierOps> host = memory::MakeHostTierOps();
    static shard::ParamStorage storage;
    ParamsAccess a;
    a.storage = &storage;
    a.range = shard::ParamRange{host.get(), nullptr, 0, bytes.data(), bytes.size(), 0, bytes.size()};
    a.in_place = bytes.data();
    return a;
  }
};

class StateStoreTest : public ::testing::Test {
 public:
  std::vector<float> HelperRead(StateStore& s, StateKind k) { return Read(s, 0, k); }

 protected:
  // One store of `units` units of `n` elements each (master apart, or the fp32 params' own storage).
  std::unique_ptr<MemoryState> Make(size_t units, size_t n, bool sgd, bool apart, bool visible = true) {
    std::vector<MemoryUnit> held(units);
    params_.assign(units, Params{});
    for (size_t u = 0; u < units; ++u) {
      held[u].elems = n;
      params_[u].bytes.assign(n * 4, 0);
      if (apart) held[u].master = Floats(alloc_, n);
      held[u].master_ptr = apart ? held[u].master.as<float>() : reinterpret_cast<float*>(params_[u].bytes.data());
      held[u].m = Floats(alloc_, n);
      if (!sgd) held[u].v = Floats(alloc_, n);
    }
    // Host memory as the engine's host tier treats it; not visible makes the store stage.
    memory::TierOps& ops = visible ? visible_ : hidden_;
    return std::make_unique<MemoryState>(ops, ops, *update_, apart, std::move(held));
  }
  std::vector<float> Read(StateStore& s, int unit, StateKind k) {
    auto v = s.Read(unit, k);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>{};
  }

  memory::MemoryTracker tracker_;
  memory::HostAllocator alloc_{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker_};
  std::vector<Params> params_;
  memory::testing::HookedTierOps visible_, hidden_;
  std::unique_ptr<TierUpdate> update_ = MakeHostTierUpdate(nullptr);
  void SetUp() override { hidden_.visible = false; }
};

TEST_F(StateStoreTest, KindsRoundTripAndEditRunsInPlaceOrStaged) {
  for (bool visible : {true, false}) {
    auto s = Make(2, 300, /*sgd=*/false, /*apart=*/true, visible);
    EXPECT_EQ(Read(*s, 1, StateKind::kExpAvgSq), std::vector<float>(300, 0.0f));  // allocators hand out zeros
    const std::vector<float> master = Values(300, 0.01f, -3), m = Values(300, 0.02f, 1);
    ASSERT_TRUE(s->Write(0, StateKind::kMaster, master).ok());
    ASSERT_TRUE(s->Write(0, StateKind::kExpAvg, m).ok());
    EXPECT_EQ(Read(*s, 0, StateKind::kMaster), master);
    EXPECT_EQ(Read(*s, 0, StateKind::kExpAvg), m);
    EXPECT_EQ(Read(*s, 0, StateKind::kExpAvgSq), std::vector<float>(300, 0.0f));
    // An edit without write-back changes the state only where the store lent it in place (the host tier).
    const auto lent = s->Lend(0, StateKind::kMaster);
    ASSERT_EQ(lent.has_value(), visible);
    if (lent) {
      EXPECT_EQ(lent->size(), 300u) << "the unit's update range";
    }
    std::vector<float> staged = Read(*s, 0, StateKind::kMaster);
    (lent ? lent->data() : staged.data())[7] = 42;
    EXPECT_EQ(Read(*s, 0, StateKind::kMaster)[7], visible ? 42.0f : master[7]) << visible;
    // Written back, it holds either way.
    staged = Read(*s, 0, StateKind::kMaster);
    staged[8] = 43;
    ASSERT_TRUE(s->Write(0, StateKind::kMaster, staged).ok());
    EXPECT_EQ(Read(*s, 0, StateKind::kMaster)[8], 43.0f) << visible;
  }
}

// Two steps of unit 0 through the store against ApplyUpdate on copies (the moments are not zero in the
// second step); the params receive the bf16 copy, the fp32 copy of a master apart, or are the master.
void ExpectStepIsApplyUpdate(StateStoreTest* t, MemoryState& s, Params& p, const OptimizerConfig& cfg, DType dtype,
                             bool apart) {
  const size_t n = 300;
  // Padding at the end; the second parameter in a param group of its own (Note [Param groups]).
  std::vector<shard::Segment> segs = {{0, 170, 0, true}, {170, 290, 1, true}};
  segs[1].group = 1;
  const std::vector<GroupHyper> groups = {{1e-2, cfg.weight_decay}, {4e-2, 0.2}};
  std::vector<std::vector<float>> ref(3, std::vector<float>(n, 0.0f));  // StateIndex order
  ref[0] = Values(n, 0.01f, -3);
  ASSERT_TRUE(s.Write(0, StateKind::kMaster, ref[0]).ok());
  std::vector<char> ref_params(p.bytes.size(), 0);
  if (!apart) std::memcpy(ref_params.data(), ref[0].data(), n * 4);
  for (int64_t step = 1; step <= 2; ++step) {
    const std::vector<float> grad = Values(n, 0.001f * static_cast<float>(step), -0.5f);
    const UnitStep up{grad.data(), &segs, p.Access(), dtype, groups, step, 0.75f, nullptr};
    auto stats = s.Step(0, cfg, up);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->bytes_read, 0u);
    ShardState st{ref[0].data(), grad.data(), ref[1].data(),
                  cfg.type == OptimizerType::kAdamW ? ref[2].data() : nullptr};
    UpdateOptions opts;
    if (dtype != DType::kF32) {
      opts.param_copy = reinterpret_cast<uint16_t*>(ref_params.data());
      opts.param_copy_dtype = dtype;
    }
    ApplyUpdate(cfg, st, segs, groups, step, 0.75f, opts);
    if (dtype == DType::kF32) std::memcpy(ref_params.data(), ref[0].data(), n * 4);
  }
  for (StateKind k : StateKinds(cfg.type)) {
    const std::vector<float> got = t->HelperRead(s, k);
    EXPECT_EQ(0, std::memcmp(got.data(), ref[StateIndex(k)].data(), n * 4)) << StateKindName(k);
  }
  EXPECT_EQ(p.bytes, ref_params);
  EXPECT_NE(ref[0], Values(n, 0.01f, -3));  // the update did something
}

TEST_F(StateStoreTest, AdamWStepWithABf16CopyIsApplyUpdate) {
  auto s = Make(1, 300, false, true);
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  params_[0].bytes.assign(300 * 2, 0);
  ExpectStepIsApplyUpdate(this, *s, params_[0], cfg, DType::kBF16, true);
}

TEST_F(StateStoreTest, SgdStepCopiesAMasterApartToFp32Params) {
  auto s = Make(1, 300, true, true);
  OptimizerConfig cfg;
  cfg.type = OptimizerType::kSgd;
  cfg.momentum = 0.9;
  ExpectStepIsApplyUpdate(this, *s, params_[0], cfg, DType::kF32, true);
}

TEST_F(StateStoreTest, StepOnTheParamStorageItselfIsApplyUpdate) {
  auto s = Make(1, 300, false, /*apart=*/false);
  OptimizerConfig cfg;
  // The master is params_[0]: the store's own view of the param storage.
  ExpectStepIsApplyUpdate(this, *s, params_[0], cfg, DType::kF32, false);
}

TEST_F(StateStoreTest, StepScalesNormsAcrossRanksClipsAndUpdatesEveryUnitAsTheReference) {
  const size_t n = 300;
  auto s = Make(3, n, false, true);
  OptimizerConfig cfg;
  cfg.weight_decay = 0.01;
  const std::vector<shard::Segment> segs = {{0, 250, 0, true}};
  std::vector<std::vector<float>> grads, ref_master, ref_m, ref_v;
  std::vector<StepUnit> units;
  for (int u = 0; u < 3; ++u) {
    grads.push_back(Values(n, 0.5f * static_cast<float>(u + 1), -1));
    ref_master.push_back(Values(n, 0.01f, static_cast<float>(u)));
    ASSERT_TRUE(s->Write(u, StateKind::kMaster, ref_master.back()).ok());
    ref_m.emplace_back(n, 0.0f);
    ref_v.emplace_back(n, 0.0f);
  }
  for (int u = 0; u < 3; ++u) units.push_back({grads[u].data(), n, &segs, params_[u].Access()});
  std::vector<std::vector<float>> ref_grads = grads;
  StepInputs in;
  in.grad_scale = 0.125f;
  in.groups = {{3e-3, cfg.weight_decay}};
  in.step = 1;
  in.max_norm = 1.0;
  in.param_dtype = DType::kF32;
  // The reference: the same operations written out.
  double local = 0;
  for (auto& g : ref_grads) {
    for (float& x : g) x *= 0.125f;
    local += SumSquares(g.data(), n);
  }
  // The sum across ranks: a second in-process rank with the same norm, which sees the sum of the two.
  auto comms = comm::CreateInProcessGroup(2, {});
  device::HostStream stream0{"control"}, stream1{"control"};
  in.norm_comm = comms[0].get();
  in.norm_stream = &stream0;
  int64_t waited = 0;
  in.norm_wait_ns = &waited;  // the engine's exposed communication time
  float seen = static_cast<float>(local);
  std::thread peer([&] {
    ASSERT_TRUE(comms[1]->AllReduce(&seen, &seen, 1, DType::kF32, comm::ReduceOp::kSum, stream1).Wait().ok());
  });
  memory::testing::HookedTierOps grads_tier;
  auto out = RunOptimizerStep(*s, cfg, grads_tier, units, in);
  peer.join();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(seen, static_cast<float>(local) * 2);  // this rank sent its local sum, in fp32
  const double norm = std::sqrt(static_cast<double>(static_cast<float>(local) * 2));
  EXPECT_EQ(out->grad_norm, norm);
  EXPECT_FALSE(out->skipped);
  EXPECT_EQ(out->clip_coef, ClipCoefficient(norm, 1.0));
  EXPECT_LT(out->clip_coef, 1.0f);  // the clip is exercised
  for (int u = 0; u < 3; ++u) {
    EXPECT_EQ(grads[u], ref_grads[u]);
    ApplyUpdate(cfg, ShardState{ref_master[u].data(), ref_grads[u].data(), ref_m[u].data(), ref_v[u].data()}, segs,
                3e-3, 1, out->clip_coef);
    EXPECT_EQ(Read(*s, u, StateKind::kMaster), ref_master[u]) << u;
    EXPECT_EQ(Read(*s, u, StateKind::kExpAvgSq), ref_v[u]) << u;
    EXPECT_EQ(0, std::memcmp(params_[u].bytes.data(), ref_master[u].data(), n * 4)) << u;
  }
}

// Records the order of the units' updates.
class OrderStore : public StateStore {
 public:
  absl::StatusOr<std::vector<float>> Read(int, StateKind) override { return std::vector<float>{}; }
  absl::Status Write(int, StateKind, const std::vector<float>&) override { return absl::OkStatus(); }
  absl::StatusOr<offload::TilePipelineStats> Step(int unit, const OptimizerConfig&, const UnitStep& up) override {
    order.push_back(unit);
    clips.push_back(up.clip_coef);
    offload::TilePipelineStats s;
    s.bytes_read = 10;
    s.read_wait_ns = 1;
    return s;
  }
  std::vector<int> order;
  std::vector<float> clips;
};

TEST(RunOptimizerStep, UpdatesLastToFirstAndSumsTheIoCounters) {
  OrderStore store;
  std::vector<float> g(4, 1.0f);
  std::vector<StepUnit> units(3, StepUnit{g.data(), 1, nullptr, {}});
  memory::testing::HookedTierOps grads_tier;
  auto out = RunOptimizerStep(store, OptimizerConfig{}, grads_tier, units, StepInputs{});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(store.order, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(out->io.bytes_read, 30u);
  EXPECT_EQ(out->io.read_wait_ns, 3);
  EXPECT_EQ(out->grad_norm, std::sqrt(3.0));  // no sum across ranks: the local norm
}

TEST(RunOptimizerStep, ANonFiniteNormSkipsEveryUpdate) {
  OrderStore store;
  std::vector<float> g = {1.0f, NAN};
  std::vector<StepUnit> units(2, StepUnit{g.data(), 2, nullptr, {}});
  StepInputs in;
  in.max_norm = 1;
  memory::testing::HookedTierOps grads_tier;
  auto out = RunOptimizerStep(store, OptimizerConfig{}, grads_tier, units, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->skipped);
  EXPECT_TRUE(store.order.empty());
  EXPECT_EQ(out->clip_coef, 1.0f);
}

// DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), restated literally in
// its own terms (cur_iter, last_overflow_iter, cur_hysteresis) as the oracle; raised: it would raise at the
// minimum scale.
struct DeepSpeedScaler {
  double cur_scale, min_scale;
  int scale_window, delayed_shift, cur_hysteresis;
  bool consecutive;
  int cur_iter = 0, last_overflow_iter = -1;
  bool raised = false;
  void Update(bool overflow) {
    raised = false;
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale) {
          raised = true;
          return;
        }
        cur_scale = std::max(cur_scale / 2, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive) cur_hysteresis = delayed_shift;
      const int stable_interval = cur_iter - last_overflow_iter - 1;
      if (stable_interval > 0 && stable_interval % scale_window == 0) {
        if (!consecutive) cur_hysteresis = delayed_shift;
        cur_scale *= 2;
      }
    }
    cur_iter += 1;
  }
};

TEST(LossScaler, StaticAndOffScalesNeverChange) {
  LossScaler off;
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_TRUE(off.Overflow());
  off.CleanStep();
  EXPECT_EQ(off.scale(), 1.0f);
  LossScaler fixed(128, DynamicScaleConfig{16, 2, 1, 1, false});
  EXPECT_TRUE(fixed.Overflow());
  fixed.CleanStep();
  fixed.CleanStep();
  EXPECT_EQ(fixed.scale(), 128.0f);
  EXPECT_FALSE(fixed.dynamic());
}

// DeepSpeed's defaults (hysteresis 2): one overflow keeps the scale, the second in a row halves it; the
// scale first doubles on the (window + 1)-th clean step; an overflow at the minimum ends the run.
TEST(LossScaler, FollowsDeepSpeedsHysteresisAndWindow) {
  LossScaler dyn(0, DynamicScaleConfig{3, 2, 2, 2, false});  // 2^3, window 2, floor 2, hysteresis 2
  EXPECT_EQ(dyn.scale(), 8.0f);
  EXPECT_TRUE(dyn.Overflow());
  EXPECT_EQ(dyn.scale(), 8.0f);  // hysteresis used up, the scale kept
  EXPECT_EQ(dyn.hysteresis_left(), 1);
  EXPECT_TRUE(dyn.Overflow());
  EXPECT_EQ(dyn.scale(), 4.0f);
  EXPECT_TRUE(dyn.Overflow());
  EXPECT_EQ(dyn.scale(), 2.0f);  // the floor
  EXPECT_FALSE(dyn.Overflow());  // at the floor: DeepSpeed raises
  EXPECT_EQ(dyn.scale(), 2.0f);
  dyn.CleanStep();
  dyn.CleanStep();
  EXPECT_EQ(dyn.scale(), 2.0f);
  dyn.CleanStep();  // the third clean step: two came before it since the overflow
  EXPECT_EQ(dyn.scale(), 4.0f);
  EXPECT_EQ(dyn.hysteresis_left(), 2);  // refilled by the growth
  dyn.Restore(64, 2, 1);
  dyn.CleanStep();
  EXPECT_EQ(dyn.scale(), 128.0f);
}

// The whole scale sequence under injected overflows, for each hysteresis rule, against the oracle.
TEST(LossScaler, SequenceUnderInjectedOverflowsMatchesDeepSpeed) {
  const std::string pattern = "..x.xx...x......xxx.x..x.....x.x.x......xx....";
  for (const int hysteresis : {1, 2, 3}) {
    for (const bool consecutive : {false, true}) {
      for (const int window : {1, 3, 5}) {
        LossScaler ours(0, DynamicScaleConfig{10, window, 1, hysteresis, consecutive});
        DeepSpeedScaler ds{1024.0, 1.0, window, hysteresis, hysteresis, consecutive};
        for (size_t i = 0; i < pattern.size(); ++i) {
          const bool overflow = pattern[i] == 'x';
          ds.Update(overflow);
          if (overflow) {
            EXPECT_EQ(ours.Overflow(), !ds.raised);
          } else {
            ours.CleanStep();
          }
          ASSERT_EQ(ours.scale(), static_cast<float>(ds.cur_scale))
              << "step " << i << " hysteresis " << hysteresis << " consecutive " << consecutive << " window " << window;
          ASSERT_EQ(ours.hysteresis_left(), ds.cur_hysteresis) << "step " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::optim
