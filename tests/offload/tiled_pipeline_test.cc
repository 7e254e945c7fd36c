// Tests for offload/tiled_pipeline: an Adam-like update of NVMe-resident state (master, m, v written
// back; grads read-only) gives the same bytes as the same update in memory; while tile i computes, the
// reads of tile i+1 and the writes of tile i-1 have been issued; a failing tile stops the pipeline
// cleanly; a pool too small is refused; a tile with a write target (write_to) is written there. Runs on
// each I/O back-end.
#include "runtime/offload/tiled_pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/base/status.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

constexpr size_t kLanes = 4;  // master, m, v, grad
constexpr size_t kTileElems = 10000;
constexpr size_t kLastTileElems = 1234;  // the tail tile is short and not a multiple of 4096 bytes

void Update(float* w, float* m, float* v, const float* g, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    m[k] = 0.9f * m[k] + 0.1f * g[k];
    v[k] = 0.99f * v[k] + 0.01f * g[k] * g[k];
    w[k] -= 0.01f * m[k] / (1.0f + v[k]);
  }
}

// Drives the pipeline as optim/nvme_state.cc does, running `work(tile, views)` on each tile.
template <typename F>
absl::StatusOr<TilePipelineStats> RunTiles(NvmeStore& store, PinnedPool& pool, absl::Span<const TileLane> lanes,
                                           F&& work) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TiledPipeline> p, TiledPipeline::Start(store, pool, lanes));
  while (p->Next()) p->Done(work(p->tile(), p->views()));
  return p->Finish();
}

class TiledPipelineTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    testing::MakeQueueAndStore(GetParam(), dir_.path(), 8 << 20, &queue_, &store_);
    if (IsSkipped() || HasFatalFailure()) return;
    auto pool = PinnedPool::Create({.buffer_count = 3 * kLanes, .buffer_bytes = kTileElems * 4}, &alloc_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(pool).value();
  }
  void TearDown() override {
    lanes_.clear();
    extents_.clear();
    store_.reset();
  }

  // `tiles` tiles per lane with deterministic contents, written to NVMe and mirrored in `mirror_`.
  void MakeState(size_t tiles) {
    extents_.assign(kLanes, {});
    mirror_.assign(kLanes, {});
    lanes_.assign(kLanes, TileLane{});
    for (size_t l = 0; l < kLanes; ++l) {
      for (size_t i = 0; i < tiles; ++i) {
        const size_t n = i + 1 == tiles ? kLastTileElems : kTileElems;
        std::vector<float> data(n);
        for (size_t k = 0; k < n; ++k) data[k] = 0.001f * static_cast<float>((l * 7919 + i * 104729 + k) % 1000);
        extents_[l].push_back(*store_->Allocate(n * 4, memory::Kind::kOptimizerState));
        testing::AlignedBuffer staging(n * 4);
        std::memcpy(staging.data(), data.data(), n * 4);
        ASSERT_TRUE(store_->Write(extents_[l].back(), staging.view()).Wait().ok());
        mirror_[l].push_back(std::move(data));
      }
    }
    for (size_t l = 0; l < kLanes; ++l) {
      for (auto& e : extents_[l]) lanes_[l].tiles.push_back(&e);
    }
    lanes_[3].write_back = false;  // gradients are an input
  }
  std::vector<float> ReadTile(size_t lane, size_t tile) {
    const NvmeExtent& e = extents_[lane][tile];
    testing::AlignedBuffer staging(e.bytes());
    EXPECT_TRUE(store_->Read(e, staging.view()).Wait().ok());
    std::vector<float> out(e.bytes() / 4);
    std::memcpy(out.data(), staging.data(), e.bytes());
    return out;
  }

  TempDir dir_;
  memory::MemoryTracker tracker_;
  memory::HostAllocator alloc_{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker_};
  std::unique_ptr<IoQueue> queue_;
  std::unique_ptr<NvmeStore> store_;
  std::unique_ptr<PinnedPool> pool_;
  std::vector<std::vector<NvmeExtent>> extents_;
  std::vector<std::vector<std::vector<float>>> mirror_;
  std::vector<TileLane> lanes_;
};

TEST_P(TiledPipelineTest, UpdatesNvmeStateLikeTheInMemoryReferenceWithOverlap) {
  constexpr size_t kTiles = 7;
  MakeState(kTiles);
  const uint64_t requests0 = queue_->stats().requests;
  auto stats = RunTiles(*store_, *pool_, lanes_, [&](size_t i, absl::Span<const memory::BufferView> v) {
    // Note [Overlap]: reads of tiles 0..i+1 (4 lanes) and writes of tiles 0..i-1 (3 lanes) are issued.
    const uint64_t issued = queue_->stats().requests - requests0;
    EXPECT_EQ(issued, kLanes * (std::min(i + 1, kTiles - 1) + 1) + 3 * i) << "tile " << i;
    Update(v[0].as<float>(), v[1].as<float>(), v[2].as<float>(), v[3].as<float>(), v[0].bytes / 4);
    return absl::OkStatus();
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tiles, kTiles);
  const uint64_t lane_bytes = ((kTiles - 1) * kTileElems + kLastTileElems) * 4;
  EXPECT_EQ(stats->bytes_read, kLanes * lane_bytes);
  EXPECT_EQ(stats->bytes_written, 3 * lane_bytes);
  EXPECT_GT(stats->compute_ns, 0);
  for (size_t i = 0; i < kTiles; ++i) {
    auto& ref = mirror_;
    Update(ref[0][i].data(), ref[1][i].data(), ref[2][i].data(), ref[3][i].data(), ref[0][i].size());
    for (size_t l = 0; l < kLanes; ++l) {
      const std::vector<float> got = ReadTile(l, i);
      ASSERT_EQ(got.size(), ref[l][i].size());
      EXPECT_EQ(std::memcmp(got.data(), ref[l][i].data(), got.size() * 4), 0) << "lane " << l << " tile " << i;
    }
  }
  EXPECT_EQ(pool_->free_count(), pool_->buffer_count());
}

// TileLane::write_to (Note [Snapshots of NVMe state] in optim/nvme_state.h): a tile with a target is written
// there and its own extent keeps its bytes; the tiles without one are written in place.
TEST_P(TiledPipelineTest, ATileWithATargetIsWrittenThereAndKeepsItsBytes) {
  constexpr size_t kTiles = 3;
  MakeState(kTiles);
  std::vector<NvmeExtent> fresh;
  fresh.reserve(kTiles);
  for (size_t i = 0; i < kTiles; ++i) fresh.push_back(*store_->Allocate(extents_[0][i].bytes(), memory::Kind::kMaster));
  lanes_[0].write_to = {&fresh[0], nullptr, &fresh[2]};  // the master's tiles 0 and 2 go elsewhere
  const std::vector<float> old0 = ReadTile(0, 0), old1 = ReadTile(0, 1), old2 = ReadTile(0, 2);
  auto stats = RunTiles(*store_, *pool_, lanes_, [&](size_t, absl::Span<const memory::BufferView> v) {
    for (const auto& view : v.first(3)) std::memset(view.data, 0, view.bytes);
    return absl::OkStatus();
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto zero = [](const std::vector<float>& t) {
    return std::all_of(t.begin(), t.end(), [](float x) { return x == 0; });
  };
  EXPECT_EQ(ReadTile(0, 0), old0);
  EXPECT_TRUE(zero(ReadTile(0, 1))) << "tile 1 has no target: in place";
  EXPECT_EQ(ReadTile(0, 2), old2);
  EXPECT_NE(old1, ReadTile(0, 1));
  for (size_t i : {0, 2}) {
    testing::AlignedBuffer staging(fresh[i].bytes());
    ASSERT_TRUE(store_->Read(fresh[i], staging.view()).Wait().ok());
    const float* f = reinterpret_cast<const float*>(staging.data());
    EXPECT_TRUE(zero(std::vector<float>(f, f + fresh[i].bytes() / 4))) << "target of tile " << i;
  }
  EXPECT_TRUE(zero(ReadTile(1, 0)));  // the other lanes in place
}

TEST_P(TiledPipelineTest, AFailingTileStopsThePipelineAndNamesIt) {
  constexpr size_t kTiles = 5;
  MakeState(kTiles);
  auto stats = RunTiles(*store_, *pool_, lanes_, [&](size_t i, absl::Span<const memory::BufferView> v) {
    if (i == 2) return absl::InternalError("optimizer blew up");
    for (const auto& view : v) std::memset(view.data, 0, view.bytes);
    return absl::OkStatus();
  });
  ASSERT_EQ(stats.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(stats.status().message()), HasSubstr("computing tile 2"));
  EXPECT_EQ(pool_->free_count(), pool_->buffer_count()) << "every buffer returned";
  for (size_t i = 0; i < kTiles; ++i) {
    const std::vector<float> got = ReadTile(0, i);
    const bool zeroed = std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; });
    EXPECT_EQ(zeroed, i < 2) << "tile " << i;
  }
}

TEST_P(TiledPipelineTest, FinishingBeforeTheLastTileIsAnErrorAndReturnsEveryBuffer) {
  MakeState(5);
  {
    auto p = TiledPipeline::Start(*store_, *pool_, lanes_);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE((*p)->Next());
    EXPECT_EQ((*p)->tile(), 0u);
    (*p)->Done(absl::OkStatus());
    auto stats = (*p)->Finish();
    ASSERT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(stats.status().message()), HasSubstr("finished after 1 of 5 tiles"));
  }
  EXPECT_EQ(pool_->free_count(), pool_->buffer_count()) << "every buffer returned";
}

TEST_P(TiledPipelineTest, RefusesAPoolWithFewerThanThreeBuffersPerLane) {
  MakeState(2);
  memory::HostAllocator small_alloc(memory::Tier::kPinnedHost, memory::kUnlimited, nullptr);
  auto small = PinnedPool::Create({.buffer_count = 5, .buffer_bytes = kTileElems * 4}, &small_alloc);
  ASSERT_TRUE(small.ok());
  auto stats = RunTiles(*store_, **small, lanes_, [](size_t, auto) { return absl::OkStatus(); });
  ASSERT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stats.status().message()), HasSubstr("needs 12 pinned buffers; the pool has 5"));
}

INSTANTIATE_TEST_SUITE_P(Backends, TiledPipelineTest, ::testing::ValuesIn(testing::Backends()),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::offload
