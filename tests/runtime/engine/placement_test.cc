// Note [Placement]: where a unit's buffers live and what a rank holds of each, decided once from the
// stage and the offload settings, against the storage table of engine_impl.h.
#include "runtime/engine/placement.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::engine {
namespace {

class Placements : public testing::Test {
 protected:
  Placement Decide(OffloadDevice param, OffloadDevice optimizer, DType dtype = DType::kF32) {
    EngineConfig cfg;
    cfg.offload_param.device = param;
    cfg.offload_optimizer.device = optimizer;
    cfg.param_dtype = dtype;
    return DecidePlacement(cfg, &device_, &host_);
  }
  memory::MemoryTracker tracker_;
  memory::HostAllocator device_{memory::Tier::kDevice, 0, &tracker_};
  memory::HostAllocator host_{memory::Tier::kPinnedHost, 0, &tracker_};
};

TEST_F(Placements, Fp32WithoutOffloadKeepsTheMasterInTheParams) {
  const Placement p = Decide(OffloadDevice::kNone, OffloadDevice::kNone);
  EXPECT_EQ(p.params, &device_);
  EXPECT_EQ(p.master, nullptr);
  EXPECT_FALSE(p.master_apart);
  EXPECT_EQ(p.grads, &device_);
  EXPECT_EQ(p.state, &device_);
}

TEST_F(Placements, LowPrecisionParamsHaveAMasterApart) {
  const Placement p = Decide(OffloadDevice::kNone, OffloadDevice::kNone, DType::kBF16);
  EXPECT_TRUE(p.master_apart);
  EXPECT_EQ(p.master, &device_);
}

TEST_F(Placements, OffloadedOptimizerStateLivesOnTheHostOrOnNvme) {
  Placement p = Decide(OffloadDevice::kNone, OffloadDevice::kCpu);
  EXPECT_EQ(p.params, &device_);
  EXPECT_TRUE(p.master_apart);
  EXPECT_EQ(p.master, &host_);
  EXPECT_EQ(p.grads, &host_);
  EXPECT_EQ(p.state, &host_);
  p = Decide(OffloadDevice::kNone, OffloadDevice::kNvme);
  EXPECT_TRUE(p.master_apart);  // on NVMe: apart, but no buffer in memory
  EXPECT_EQ(p.master, nullptr);
  EXPECT_EQ(p.state, nullptr);
  EXPECT_EQ(p.grads, &host_);  // gradients stay in pinned host memory
}

TEST_F(Placements, OffloadedParamsLiveOnTheHostOrInTheNvmeCache) {
  Placement p = Decide(OffloadDevice::kCpu, OffloadDevice::kCpu);
  EXPECT_EQ(p.params, &host_);
  p = Decide(OffloadDevice::kNvme, OffloadDevice::kCpu);
  EXPECT_EQ(p.params, nullptr);
  EXPECT_TRUE(p.master_apart);
  EXPECT_EQ(p.master, &host_);
}

// Two parameters of 24 and 30 elements over 4 ranks: w [0, 24), b [32, 62) (parameters start 16-aligned),
// 16 elements per rank, 64 in all.
shard::UnitLayout Layout() {
  auto l = shard::UnitLayout::Build("u", {shard::ParamSpec{"w", {24}, true, shard::Init::Zeros()},
                                          shard::ParamSpec{"b", {30}, false, shard::Init::Zeros()}}, 4);
  EXPECT_TRUE(l.ok()) << l.status();
  return *std::move(l);
}

std::string Describe(const UnitExtents& e) {
  std::string s = absl::StrCat("p[", e.param_begin, "+", e.param_elems, ") g[", e.grad_begin, "+", e.grad_elems,
                               ") u[", e.update_begin, "+", e.update_elems, ")");
  for (const shard::Segment& seg : e.update_segments) absl::StrAppend(&s, " ", seg.param, ":", seg.begin, "-", seg.end);
  return s;
}

TEST(Extents, EachStageShardsOneMoreBuffer) {
  const shard::UnitLayout l = Layout();
  ASSERT_EQ(l.shard_elems, 16u);
  EXPECT_EQ(Describe(DecideExtents(0, 1, l)), "p[0+64) g[0+64) u[0+64) 0:0-24 1:32-62");
  EXPECT_EQ(Describe(DecideExtents(1, 1, l)), "p[0+64) g[0+64) u[16+16) 0:0-8");
  EXPECT_EQ(Describe(DecideExtents(2, 1, l)), "p[0+64) g[16+16) u[16+16) 0:0-8");
  EXPECT_EQ(Describe(DecideExtents(3, 1, l)), "p[16+16) g[16+16) u[16+16) 0:0-8");
  EXPECT_EQ(Describe(DecideExtents(3, 3, l)), "p[48+16) g[48+16) u[48+16) 1:0-14");  // the padding is not updated
}

// Note [Frozen units]: no gradients and no update, but the same owned range as the trainable unit.
TEST(Extents, AFrozenUnitHasNoGradientsAndNoUpdateButOwnsItsShard) {
  auto l = shard::UnitLayout::Build("u", {shard::ParamSpec{"w", {24}, true, shard::Init::Zeros(), true},
                                          shard::ParamSpec{"b", {30}, false, shard::Init::Zeros(), true}}, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(Describe(DecideExtents(0, 1, *l)), "p[0+64) g[0+0) u[0+64)");
  EXPECT_EQ(Describe(DecideExtents(1, 1, *l)), "p[0+64) g[0+0) u[16+16)");
  EXPECT_EQ(Describe(DecideExtents(2, 1, *l)), "p[0+64) g[16+0) u[16+16)");
  EXPECT_EQ(Describe(DecideExtents(3, 1, *l)), "p[16+16) g[16+0) u[16+16)");
  EXPECT_TRUE(DecideExtents(3, 1, *l).frozen);
  EXPECT_FALSE(DecideExtents(3, 1, Layout()).frozen);
}

TEST(Shared, EachBufferOnlyWhereTheRunHasIt) {
  memory::MemoryTracker tracker;
  memory::HostAllocator device{memory::Tier::kDevice, 0, &tracker}, host{memory::Tier::kPinnedHost, 0, &tracker};
  const SharedSizes sizes{1, 2, 3, 4, 5};
  auto names = [&](const EngineConfig& cfg) {
    std::string s;
    for (const SharedBuffer& b : SharedBuffers(cfg, sizes, &device, &host)) {
      absl::StrAppend(&s, b.what, "=", b.bytes, b.tier == &host ? "h" : "d", b.before_units ? "<" : ">", "; ");
    }
    return s;
  };
  EngineConfig cfg;
  cfg.stage = 1;
  EXPECT_EQ(names(cfg), "gradient staging=5h>; ");
  cfg.stage = 2;
  EXPECT_EQ(names(cfg), "gradient buffers=4d>; gradient staging=5h>; ");
  cfg.stage = 3;
  cfg.offload_param.device = OffloadDevice::kNvme;
  cfg.offload_optimizer.device = OffloadDevice::kNvme;
  EXPECT_EQ(names(cfg), "NVMe staging buffers=1h<; NVMe parameter buffers=2h<; gathered units=3d>; "
                        "gradient buffers=4d>; gradient staging=5h>; ");
}

}  // namespace
}  // namespace strata::engine
