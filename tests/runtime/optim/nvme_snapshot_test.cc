// Note [Snapshots of NVMe state] (optim/nvme_state.h): a snapshot of a unit's NVMe lanes keeps the values of
// its moment while updates and writes move the live state on (they go to fresh extents: redirect on write),
// the live state equals that of a run without a snapshot bit for bit, the space of the old tiles returns to
// the store once the snapshot let go of them, and the tiles are written in place again afterwards. Without
// room for a redirect (a store of exactly the state's size: fault injection), the update waits until the
// snapshot, read on another thread, lets go of tiles, and then finishes with the same values (labelled tsan:
// the snapshot is read on one thread while the other updates).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/crc32.h"
#include "runtime/optim/nvme_state.h"
#include "tests/offload/offload_test_util.h"

namespace strata::optim {
namespace {

constexpr size_t kTile = 1000;
const std::vector<size_t> kElems = {2500, 700};  // unit 0: tiles of 1000, 1000, 500; unit 1: one short tile

std::vector<float> Values(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 1009) + offset;
  return v;
}

// One NvmeState of AdamW over kElems in its own directory, on a store of `capacity_factor` x the state's bytes.
struct Rig {
  explicit Rig(uint64_t capacity_factor) {
    const std::vector<StateKind> kinds = StateKinds(OptimizerType::kAdamW);
    std::unique_ptr<offload::NvmeStore> store;
    offload::testing::MakeQueueAndStore(offload::IoBackend::kThreads, dir.path(),
                                        capacity_factor * NvmeState::StoreBytes(kTile, kinds.size(), kElems), &queue,
                                        &store);
    if (store == nullptr) return;
    store_ptr = store.get();
    auto pool = offload::PinnedPool::Create({.buffer_count = 9, .buffer_bytes = kTile * 4}, &alloc);
    EXPECT_TRUE(pool.ok()) << pool.status();
    auto s = NvmeState::Create(std::move(store), std::move(pool).value(), kTile, kinds, kElems);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) state = std::move(s).value();
    if (state != nullptr) {
      EXPECT_TRUE(state->Write(0, StateKind::kMaster, Values(kElems[0], 0.01f, -3)).ok());
    }
  }
  // One AdamW step of unit 0 with gradients of `step`.
  absl::Status Step(int64_t step) {
    const size_t n = kElems[0];
    const std::vector<shard::Segment> segs = {{0, 1300, 0, true}, {1300, 2450, 1, false}};
    const std::vector<GroupHyper> groups = {{1e-2, 0.1}};
    const std::vector<float> grad = Values(n, 0.001f * static_cast<float>(step), -0.5f);
    params.assign(n * 2, 0);
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1;
    const TiledUpdate up{grad.data(), &segs, params.data(), DType::kBF16, groups, step, 0.75f, nullptr};
    return state->Update(0, cfg, up).status();
  }
  std::vector<float> Read(int unit, StateKind k) {
    auto v = state->Read(unit, k);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>{};
  }

  offload::testing::TempDir dir;
  memory::MemoryTracker tracker;
  memory::HostAllocator alloc{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker};
  std::unique_ptr<offload::IoQueue> queue;
  offload::NvmeStore* store_ptr = nullptr;
  std::unique_ptr<NvmeState> state;
  std::vector<char> params;
};

// Reads a snapshot front to back in pieces of `piece` elements.
std::vector<float> ReadAll(KindSnapshot& s, size_t piece) {
  std::vector<float> out(s.elems());
  for (size_t at = 0; at < out.size(); at += piece) {
    const absl::Status r = s.Read(at, std::min(piece, out.size() - at), out.data() + at);
    EXPECT_TRUE(r.ok()) << r;
  }
  return out;
}

const std::vector<StateKind> kKinds = StateKinds(OptimizerType::kAdamW);

// Step `step` on both rigs.
bool StepBoth(Rig& a, Rig& b, int64_t step) {
  if (a.state == nullptr || b.state == nullptr) return false;
  const absl::Status sa = a.Step(step), sb = b.Step(step);
  EXPECT_TRUE(sa.ok()) << sa;
  EXPECT_TRUE(sb.ok()) << sb;
  return sa.ok() && sb.ok();
}

// Every kind of `units` (and the params of the last step) the same, bit for bit, in both rigs.
void ExpectSameLiveState(Rig& a, Rig& b, const std::vector<int>& units) {
  for (StateKind k : kKinds) {
    for (int unit : units) {
      const std::vector<float> got = a.Read(unit, k), want = b.Read(unit, k);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << StateKindName(k) << " unit " << unit;
    }
  }
  EXPECT_EQ(a.params, b.params);
}

TEST(NvmeSnapshot, KeepsItsMomentWhileTheLiveStateMovesOnUnchanged) {
  Rig rig(2), plain(2);
  ASSERT_TRUE(StepBoth(rig, plain, 1));
  std::vector<std::vector<float>> before;
  std::vector<std::unique_ptr<KindSnapshot>> snaps;
  for (StateKind k : kKinds) {
    before.push_back(rig.Read(0, k));
    snaps.push_back(rig.state->Snapshot(0, k));
    ASSERT_NE(snaps.back(), nullptr);
    EXPECT_EQ(snaps.back()->elems(), kElems[0]);
    EXPECT_EQ(snaps.back()->held_bytes(), 3 * 4096u);  // three tiles, none copied
  }
  const uint64_t used = rig.store_ptr->used_bytes();
  // Two steps and a write of unit 1's master (not snapshotted: in place) while the snapshots are held.
  ASSERT_TRUE(StepBoth(rig, plain, 2));
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 9u);  // every tile of the three lanes, once
  EXPECT_EQ(rig.store_ptr->used_bytes(), used + 9 * 4096u);
  ASSERT_TRUE(StepBoth(rig, plain, 3));
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 9u) << "the fresh tiles are the live state's alone";
  ASSERT_TRUE(rig.state->Write(1, StateKind::kMaster, Values(kElems[1], 2, 1)).ok());
  ASSERT_TRUE(plain.state->Write(1, StateKind::kMaster, Values(kElems[1], 2, 1)).ok());
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 9u);
  // The live state is the one of the run without snapshots, bit for bit (and the step changed it).
  ExpectSameLiveState(rig, plain, {0, 1});
  EXPECT_NE(rig.Read(0, StateKind::kMaster), before[0]);
  // The snapshots hold the values of their moment, read in pieces across tiles (one tile of staging each).
  for (size_t i = 0; i < snaps.size(); ++i) {
    EXPECT_EQ(snaps[i]->staging_bytes(), 4096u);
    const std::vector<float> got = ReadAll(*snaps[i], 333);
    EXPECT_EQ(0, std::memcmp(got.data(), before[i].data(), got.size() * 4)) << StateKindName(kKinds[i]);
    // Read to the end, it let go of every tile: their space is back.
    EXPECT_FALSE(snaps[i]->Read(0, 1, nullptr).ok()) << "read again after it let go";
  }
  EXPECT_EQ(rig.store_ptr->used_bytes(), used);
  // A write after the snapshot let go is in place again; a snapshot released unread lets go too.
  auto unread = rig.state->Snapshot(1, StateKind::kExpAvg);
  ASSERT_TRUE(rig.Step(4).ok());
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 9u);
  unread->Release();
  ASSERT_TRUE(rig.state->Write(1, StateKind::kExpAvg, Values(kElems[1], 1, 0)).ok());
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 9u);
  EXPECT_EQ(rig.state->redirect_stats().waits, 0u);
  EXPECT_EQ(rig.store_ptr->used_bytes(), used);
}

// Note [Cloned checkpoint lanes] (checkpoint/files.h): Files() names where each tile's bytes lie, with the store's
// checksum of them, for a writer that clones them; Skip lets go of what lies wholly before it, and Skip to the end
// of everything (the last, partial tile too), so the next step writes every tile in place.
TEST(NvmeSnapshot, FilesNameTheTilesAndSkipLetsGo) {
  Rig rig(2);
  ASSERT_NE(rig.state, nullptr);
  ASSERT_TRUE(rig.Step(1).ok());
  const std::vector<float> master = rig.Read(0, StateKind::kMaster);
  auto snap = rig.state->Snapshot(0, StateKind::kMaster);
  ASSERT_NE(snap, nullptr);
  const std::optional<LaneFiles> files = snap->Files();
  ASSERT_TRUE(files.has_value());
  EXPECT_EQ(files->tile_elems, kTile);
  ASSERT_EQ(files->tiles.size(), 3u);
  ASSERT_EQ(files->crcs.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {  // the pieces hold the tile's elements, and the checksum is theirs
    std::string bytes;
    for (const LanePiece& p : files->tiles[t]) {
      const int fd = ::open(p.open_path.c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0) << p.open_path;
      std::string piece(p.bytes, '\0');
      EXPECT_EQ(::pread(fd, piece.data(), piece.size(), static_cast<off_t>(p.offset)), static_cast<ssize_t>(p.bytes));
      ::close(fd);
      bytes += piece;
    }
    const size_t elems = std::min(kTile, kElems[0] - t * kTile);
    ASSERT_GE(bytes.size(), elems * 4);
    EXPECT_EQ(0, std::memcmp(bytes.data(), master.data() + t * kTile, elems * 4)) << "tile " << t;
    ASSERT_TRUE(files->crcs[t].has_value());
    EXPECT_EQ(*files->crcs[t], Crc32(bytes.data(), elems * 4)) << "tile " << t;
  }
  snap->Skip(kTile + 1);  // tile 0 only
  ASSERT_TRUE(rig.Step(2).ok());
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 2u) << "tiles 1 and 2 are still held";
  snap = rig.state->Snapshot(0, StateKind::kMaster);
  snap->Skip(kElems[0]);
  ASSERT_TRUE(rig.Step(3).ok());
  EXPECT_EQ(rig.state->redirect_stats().redirected_tiles, 2u) << "a tile was still held after a skip to the end";
  snap.reset();
}

// Note [Cloned checkpoint lanes] (decision 0058): Check(t) says whether the tile's bytes were checked by a read
// through the store since they were written (the next step's update reads every tile before it rewrites it), and
// whether the live state needs the tile let go now: it wrote it elsewhere (unread or read), or it waits for room.
TEST(NvmeSnapshot, CheckSaysWhetherTheStepReadTheTileAndWhetherItWaits) {
  {
    Rig rig(2);
    ASSERT_NE(rig.state, nullptr);
    ASSERT_TRUE(rig.Step(1).ok());
    auto snap = rig.state->Snapshot(0, StateKind::kMaster);
    for (size_t t = 0; t < 3; ++t) {  // just written by the step: nobody read them since
      EXPECT_FALSE(snap->Check(t).checked) << t;
      EXPECT_FALSE(snap->Check(t).let_go_now) << t;
    }
    ASSERT_TRUE(rig.Step(2).ok());  // reads every tile, checks it, writes it elsewhere
    for (size_t t = 0; t < 3; ++t) {
      EXPECT_TRUE(snap->Check(t).checked) << t;
      EXPECT_TRUE(snap->Check(t).let_go_now) << t;
    }
    snap = rig.state->Snapshot(0, StateKind::kMaster);
    ASSERT_TRUE(rig.state->Write(0, StateKind::kMaster, Values(kElems[0], 0.02f, 1)).ok());  // rewritten unread
    for (size_t t = 0; t < 3; ++t) {
      EXPECT_FALSE(snap->Check(t).checked) << t;
      EXPECT_TRUE(snap->Check(t).let_go_now) << t;
    }
    snap->Skip(kTile);
    EXPECT_FALSE(snap->Check(0).checked) << "a tile let go is not checked";
  }
  Rig rig(1);  // no room for a redirect: the step waits for the snapshot, which Check says
  ASSERT_NE(rig.state, nullptr);
  ASSERT_TRUE(rig.Step(1).ok());
  std::vector<std::unique_ptr<KindSnapshot>> snaps;
  for (StateKind k : kKinds) snaps.push_back(rig.state->Snapshot(0, k));
  EXPECT_FALSE(snaps[0]->Check(0).let_go_now);
  absl::Status stepped;
  std::thread step([&] { stepped = rig.Step(2); });
  bool seen = false;
  for (int i = 0; i < 60000 && !seen; ++i) {  // a hang, not a slow machine, runs out of these 60 s
    seen = std::any_of(snaps.begin(), snaps.end(), [](const auto& s) { return s->Check(0).let_go_now; });
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(seen) << "the step waits for room, and no snapshot's Check said so";
  snaps.clear();
  step.join();
  EXPECT_TRUE(stepped.ok()) << stepped;
}

// Fault injection: the store holds the state and nothing more, so every redirect is out of room.
TEST(NvmeSnapshot, WithoutRoomTheUpdateWaitsForTheSnapshotToLetGo) {
  Rig rig(1), plain(1);
  ASSERT_TRUE(StepBoth(rig, plain, 1));
  std::vector<std::vector<float>> before, read(kKinds.size());
  std::vector<std::unique_ptr<KindSnapshot>> snaps;
  for (StateKind k : kKinds) {
    before.push_back(rig.Read(0, k));
    snaps.push_back(rig.state->Snapshot(0, k));
  }
  // The writer: starts once the update waits for room (a snapshot's Check says so; or once the steps returned,
  // which they do without a wait only if the update never found the store full), then reads every lane front to
  // back (as the checkpoint's writer does).
  std::atomic<bool> steps_returned{false};
  std::thread writer([&] {
    auto waited_on = [&] {
      return std::any_of(snaps.begin(), snaps.end(), [](const auto& s) { return s->Check(0).let_go_now; });
    };
    for (int i = 0; i < 60000 && !waited_on() && !steps_returned.load(); ++i) {  // a hang runs out of these 60 s
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (size_t i = 0; i < snaps.size(); ++i) {
      read[i] = ReadAll(*snaps[i], 600);
      snaps[i].reset();
    }
  });
  const bool stepped = StepBoth(rig, plain, 2);
  steps_returned.store(true);
  writer.join();
  ASSERT_TRUE(stepped);
  EXPECT_GT(rig.state->redirect_stats().waits, 0u) << "the update never found the store full";
  for (size_t i = 0; i < kKinds.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(read[i].data(), before[i].data(), before[i].size() * 4)) << StateKindName(kKinds[i]);
  }
  ExpectSameLiveState(rig, plain, {0});
  EXPECT_EQ(rig.store_ptr->used_bytes(), rig.store_ptr->capacity_bytes());
}

}  // namespace
}  // namespace strata::optim
