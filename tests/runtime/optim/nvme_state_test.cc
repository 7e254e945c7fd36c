// optim::NvmeState: optimizer state on NVMe in tiles. Every kind but the master starts zero; a kind
// written comes back whole across tiles (the last one short); the tiled update gives the same bits as
// one in-memory ApplyUpdate over the whole range, for AdamW with a bf16 param copy and SGD with fp32
// params (directly and through StateStore::Step), and reports the bytes it moved.
#include "runtime/optim/nvme_state.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/shard/param_storage.h"
#include "tests/offload/offload_test_util.h"

namespace strata::optim {
namespace {

constexpr size_t kTile = 1000;
const std::vector<size_t> kElems = {2500, 700};  // unit 0: tiles of 1000, 1000, 500; unit 1: one short tile

class NvmeStateTest : public ::testing::Test {
 public:
  std::vector<float> HelperRead(int unit, StateKind k) { return Read(unit, k); }

 protected:
  void Make(std::vector<StateKind> kinds) {
    std::unique_ptr<offload::NvmeStore> store;
    offload::testing::MakeQueueAndStore(offload::IoBackend::kThreads, dir_.path(),
                                        NvmeState::StoreBytes(kTile, kinds.size(), kElems), &queue_, &store);
    if (HasFatalFailure()) return;
    auto pool = offload::PinnedPool::Create({.buffer_count = 9, .buffer_bytes = kTile * 4}, &alloc_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    auto s = NvmeState::Create(std::move(store), std::move(pool).value(), kTile, kinds, kElems);
    ASSERT_TRUE(s.ok()) << s.status();
    state_ = std::move(s).value();
  }
  std::vector<float> Read(int unit, StateKind k) {
    auto v = state_->Read(unit, k);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>{};
  }

  offload::testing::TempDir dir_;
  memory::MemoryTracker tracker_;
  memory::HostAllocator alloc_{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker_};
  std::unique_ptr<offload::IoQueue> queue_;
  std::unique_ptr<NvmeState> state_;
};

std::vector<float> Values(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 1009) + offset;
  return v;
}

TEST_F(NvmeStateTest, StateStartsZeroAndAWrittenKindComesBackAcrossTiles) {
  Make(StateKinds(OptimizerType::kAdamW));
  ASSERT_NE(state_, nullptr);
  EXPECT_EQ(Read(0, StateKind::kExpAvg), std::vector<float>(2500, 0.0f));
  EXPECT_EQ(Read(1, StateKind::kExpAvgSq), std::vector<float>(700, 0.0f));
  const std::vector<float> master = Values(2500, 0.01f, -3);
  ASSERT_TRUE(state_->Write(0, StateKind::kMaster, master).ok());
  EXPECT_EQ(Read(0, StateKind::kMaster), master);
  EXPECT_EQ(Read(0, StateKind::kExpAvg), std::vector<float>(2500, 0.0f));  // other lanes untouched
}

// The tiled update of unit 0 against ApplyUpdate over the whole range in memory, twice (so the moments
// are not zero in the second step).
void ExpectSameAsInMemory(NvmeStateTest* t, NvmeState& state, const OptimizerConfig& cfg, DType dtype) {
  const size_t n = kElems[0];
  const std::vector<StateKind> kinds = StateKinds(cfg.type);
  std::vector<std::vector<float>> mem(3, std::vector<float>(n, 0.0f));  // StateIndex order
  mem[0] = Values(n, 0.01f, -3);
  ASSERT_TRUE(state.Write(0, StateKind::kMaster, mem[0]).ok());
  // Three parameters, two with weight decay, the last two in a second param group (Note [Param groups]) that
  // the tiles must keep, and padding at the end.
  std::vector<shard::Segment> segs = {{0, 1300, 0, true}, {1300, 2000, 1, true}, {2000, 2450, 2, false}};
  segs[1].group = segs[2].group = 1;
  const std::vector<GroupHyper> groups = {{1e-2, cfg.weight_decay}, {3e-2, 0.3}};
  const size_t pb = DTypeBytes(dtype);
  std::vector<char> tiled_params(n * pb, 0), mem_params(n * pb, 0);
  const std::unique_ptr<memory::TierOps> host = memory::MakeHostTierOps();  // the params are host memory
  shard::ParamStorage storage;
  for (int64_t step = 1; step <= 2; ++step) {
    const std::vector<float> grad = Values(n, 0.001f * static_cast<float>(step), -0.5f);
    TiledUpdate up{grad.data(), &segs, tiled_params.data(), dtype, groups, step, 0.75f, nullptr};
    // The second step goes through the StateStore interface (the engine's way), the first directly.
    ParamsAccess params;
    params.storage = &storage;
    params.range = shard::ParamRange{host.get(), nullptr, 0, tiled_params.data(), n * pb, 0, n * pb};
    const UnitStep unit_step{grad.data(), &segs, params, dtype, groups, step, 0.75f, nullptr};
    auto stats = step == 1 ? state.Update(0, cfg, up) : static_cast<StateStore&>(state).Step(0, cfg, unit_step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->tiles, 3u);
    EXPECT_EQ(stats->bytes_read, kinds.size() * n * 4);
    EXPECT_EQ(stats->bytes_written, kinds.size() * n * 4);
    ShardState s{mem[0].data(), grad.data(), mem[1].data(), kinds.size() > 2 ? mem[2].data() : nullptr};
    UpdateOptions opts;
    if (dtype != DType::kF32) {
      opts.param_copy = reinterpret_cast<uint16_t*>(mem_params.data());
      opts.param_copy_dtype = dtype;
    }
    ApplyUpdate(cfg, s, segs, groups, step, 0.75f, opts);
    if (dtype == DType::kF32) std::memcpy(mem_params.data(), mem[0].data(), n * 4);
  }
  for (StateKind k : kinds) {
    std::vector<float> got = t->HelperRead(0, k);
    EXPECT_EQ(0, std::memcmp(got.data(), mem[StateIndex(k)].data(), n * 4)) << StateKindName(k);
  }
  EXPECT_EQ(tiled_params, mem_params);
  EXPECT_NE(mem[0], Values(n, 0.01f, -3));  // the update did something
}

TEST_F(NvmeStateTest, AdamWTiledUpdateMatchesTheInMemoryUpdateBitForBit) {
  Make(StateKinds(OptimizerType::kAdamW));
  ASSERT_NE(state_, nullptr);
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  ExpectSameAsInMemory(this, *state_, cfg, DType::kBF16);
}

TEST_F(NvmeStateTest, SgdTiledUpdateMatchesTheInMemoryUpdateBitForBit) {
  Make(StateKinds(OptimizerType::kSgd));
  ASSERT_NE(state_, nullptr);
  OptimizerConfig cfg;
  cfg.type = OptimizerType::kSgd;
  cfg.momentum = 0.9;
  ExpectSameAsInMemory(this, *state_, cfg, DType::kF32);
}

}  // namespace
}  // namespace strata::optim
