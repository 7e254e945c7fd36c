#include "runtime/checkpoint/async_save.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/crc32.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/publish.h"
#include "runtime/device/host_device.h"
#include "runtime/offload/nvme_files.h"

namespace strata::checkpoint {

namespace {
constexpr char kAsyncSaveFailure[] = "strata.checkpoint/async_save_failure";
std::function<void()>& BeforeWriteHook() {
  static std::function<void()> hook;
  return hook;
}
}  // namespace

void SetBeforeAsyncWriteForTest(std::function<void()> hook) { BeforeWriteHook() = std::move(hook); }

bool IsAsyncSaveFailure(const absl::Status& s) { return s.GetPayload(kAsyncSaveFailure).has_value(); }

uint64_t TiledBytes(const ShardSnapshot& snapshot) {
  uint64_t n = 0;
  for (const ShardLane& l : snapshot.tiled) n += l.elems * 4;
  return n;
}

namespace {
// This machine's identity for a file system's: the kernel's boot id, which every container on the host shares
// (their host names may differ), else the host name. 0 where neither can be read.
uint64_t MachineKey() {
  std::string id;
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r"); f != nullptr) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) id = buf;
    std::fclose(f);
  }
  if (id.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) id = host;
  }
  return id.empty() ? 0 : Crc32(id.data(), id.size()) | (uint64_t{1} << 32);
}

// Which file system of which machine `dir` is on (statvfs's f_fsid: two machines' local disks may share one); 0
// where it cannot tell.
uint64_t FileSystemOf(const std::string& dir) {
  struct statvfs v;
  if (::statvfs(dir.c_str(), &v) != 0) return 0;
  const uint64_t machine = MachineKey();
  return machine == 0 ? 0 : (machine * 1000003u ^ static_cast<uint64_t>(v.f_fsid)) | 1;
}

struct RoomClaim {
  uint64_t file_system = 0;
  uint64_t free = 0;
  uint64_t clones = 0;    // the tiled lanes' bytes: cloned now, taken when the steps rewrite them
  uint64_t streamed = 0;  // the rest of the shard: taken as the save writes it, before the steps' copies
};
}  // namespace

uint64_t StreamedBytes(const ShardSnapshot& snapshot) {
  uint64_t all = 0;
  for (const ShardRange& r : snapshot.ranges) all += r.count * 4;
  const uint64_t tiled = TiledBytes(snapshot);
  return all > tiled ? all - tiled : 0;
}

absl::StatusOr<CloneRoom> SharedCloneRoom(comm::Communicator& control, device::Stream& stream, const std::string& dir,
                                          uint64_t clones, uint64_t streamed) {
  RoomClaim claim{FileSystemOf(dir), offload::FreeBytes(dir), clones, streamed};
  std::vector<RoomClaim> all(control.size());
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(control, &claim, all.data(), sizeof(RoomClaim), stream).Wait());
  CloneRoom room;
  room.free = claim.free;
  room.need = clones + streamed;
  room.ranks = 1;
  for (int r = 0; r < control.size(); ++r) {
    if (r == control.rank() || claim.file_system == 0 || all[r].file_system != claim.file_system) continue;
    *room.need += all[r].clones + all[r].streamed;
    if (all[r].clones + all[r].streamed > 0) ++room.ranks;
  }
  return room;
}

uint64_t ShardSnapshot::bytes() const {
  uint64_t n = 0;
  for (const auto& b : buffers) n += b.size() * sizeof(float);
  return n;
}

uint64_t ShardSnapshot::nvme_bytes() const {
  uint64_t n = 0;
  for (const auto& l : lanes) n += l != nullptr ? l->held_bytes() : 0;
  return n;
}

uint64_t ShardSnapshot::in_place_bytes() const {
  uint64_t n = 0;
  for (const auto& l : lanes) n += l != nullptr ? l->in_place_bytes() : 0;
  return n;
}

uint64_t ShardSnapshot::staging_bytes() const {
  uint64_t n = 0;
  for (const auto& l : lanes) n = std::max<uint64_t>(n, l != nullptr ? l->staging_bytes() : 0);
  return n;
}

namespace {
// Floats a range of a lane is streamed in: the writer's own piece of host memory (1 MiB).
constexpr uint64_t kPieceFloats = uint64_t{1} << 18;
constexpr uint64_t kBlock = 4096;

// The NVMe files a save clones from, each opened once (read-only).
class Sources {
 public:
  absl::StatusOr<int> Open(const optim::LanePiece& p) {
    auto it = fds_.find(p.open_path);
    if (it != fds_.end()) return it->second.get();
    const int fd = ::open(p.open_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Annotate(ErrnoError("open", errno, __FILE__, __LINE__), p.name);
    return fds_.emplace(p.open_path, Fd(fd)).first->second.get();
  }

 private:
  std::map<std::string, Fd> fds_;
};

// A lane cloned whole, its snapshot held until each tile's bytes are checked (Note [Cloned checkpoint lanes]).
struct HeldLane {
  struct Tile {
    size_t index = 0;
    uint64_t end = 0;  // the lane's element after it
    uint32_t crc = 0;  // the store's
    ShardWriter::ClonedTile cloned;
    std::string source;  // where it was cloned from, for errors
  };
  std::unique_ptr<optim::KindSnapshot> snapshot;
  std::vector<Tile> tiles;
  size_t next = 0;  // tiles before it are checked and let go
};

// What a save's clones came to (Note [Cloned checkpoint lanes] in files.h), for its log line.
struct Cloning {
  bool on = false;      // cloning; turned off for the rest of the save by the first refusal
  uint64_t bytes = 0;   // cloned
  std::string why_not;  // why it streamed, where it did
  // Whether cloned tiles are held for the steps to check: only where the store has room for the steps to write the
  // tiles apart from them (decided at the first lane); else each is read back and let go at once.
  std::optional<bool> hold;
  uint64_t held_need = 0;  // the NVMe bytes the snapshot holds
  CloneCounts counts;
  std::vector<HeldLane> held;
};

// A cloned tile's bytes as the file holds them, read back and checked against the store's CRC of them.
absl::Status ReadBack(const std::string& path, ShardWriter& w, const HeldLane::Tile& t) {
  STRATA_ASSIGN_OR_RETURN(const uint32_t got, w.ClonedCrc(t.cloned));
  if (got == t.crc) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": NVMe tile ", t.index, " of a lane (", t.source,
                                          ") fails its checksum: stored crc32 0x", absl::Hex(t.crc), ", read 0x",
                                          absl::Hex(got)));
}

// Note [Cloned checkpoint lanes] (files.h): the whole blocks of lane `l` cloned from the files of its tiles, tile by
// tile, and its last partial block read from them; its snapshot then goes to `cloning.held` for its tiles to be
// checked. Where the lane cannot be cloned whole (a refusal, a tile never written), what was cloned is read back and
// checked at once, and the rest streamed from the snapshot.
absl::Status WriteTiledLane(const std::string& path, ShardWriter& w, size_t l, const ShardLane& lane,
                            std::unique_ptr<optim::KindSnapshot>& snap, Cloning& cloning, Sources& sources,
                            std::vector<float>& piece) {
  const std::optional<optim::LaneFiles> files = cloning.on ? snap->Files() : std::nullopt;
  if (files.has_value() && files->tile_elems * 4 % kBlock != 0) {
    cloning.on = false;
    cloning.why_not = absl::StrCat("NVMe tiles of ", files->tile_elems, " elements are not whole 4096-byte blocks");
  }
  if (files.has_value() && !cloning.hold.has_value()) cloning.hold = files->store_free_bytes >= cloning.held_need;
  HeldLane held;
  for (size_t t = 0; files.has_value() && cloning.on && t < files->tiles.size() && files->crcs[t].has_value(); ++t) {
    const uint64_t end = std::min<uint64_t>((t + 1) * files->tile_elems, lane.elems);
    std::vector<ShardWriter::CloneSource> from;
    for (const optim::LanePiece& p : files->tiles[t]) {
      const absl::StatusOr<int> fd = sources.Open(p);  // a file it cannot open is one it cannot clone from
      if (!fd.ok()) {
        cloning.on = false;
        cloning.why_not = std::string(fd.status().message());
        break;
      }
      from.push_back({*fd, p.name, p.offset, p.bytes});
    }
    if (!cloning.on || from.empty()) break;
    absl::StatusOr<ShardWriter::ClonedTile> cloned =
        w.CloneTile(l, from, (end - t * files->tile_elems) * 4, *files->crcs[t]);
    if (absl::IsUnimplemented(cloned.status())) {
      cloning.on = false;
      cloning.why_not = std::string(cloned.status().message());
      break;
    }
    STRATA_RETURN_IF_ERROR(cloned.status());
    cloning.bytes += cloned->bytes - cloned->tail.size();
    ++cloning.counts.tiles;
    held.tiles.push_back(
        {t, end, *files->crcs[t], *std::move(cloned), absl::StrCat(from[0].path, " at offset ", from[0].offset)});
    if (!*cloning.hold) {  // no room for the steps to write apart from it: checked and let go at once
      STRATA_RETURN_IF_ERROR(ReadBack(path, w, held.tiles.back()));
      held.tiles.clear();
      snap->Skip(end);
    }
  }
  if (w.lane_done(l) == lane.elems && !held.tiles.empty()) {
    held.snapshot = std::move(snap);
    cloning.held.push_back(std::move(held));
    return absl::OkStatus();
  }
  for (const HeldLane::Tile& t : held.tiles) STRATA_RETURN_IF_ERROR(ReadBack(path, w, t));
  snap->Skip(w.lane_done(l));
  for (uint64_t done = w.lane_done(l); done < lane.elems;) {
    const uint64_t n = std::min<uint64_t>(lane.elems - done, kPieceFloats);
    piece.resize(n);
    STRATA_RETURN_IF_ERROR(snap->Read(done, n, piece.data()));
    STRATA_RETURN_IF_ERROR(w.WriteLane(l, piece.data(), n));
    done += n;
  }
  snap.reset();  // its tiles, and its staging, let go at once
  return absl::OkStatus();
}

// Note [Cloned checkpoint lanes]: each held tile is let go once its bytes are known good: checked by the live
// state's read of them (the step's update reads every tile it rewrites, and checks it), or read back from the file
// here and checked, where nobody will check it: the live state wrote it elsewhere unread, or waits for room, or
// `hurry` is set (the training waits for the save), or kCloneHoldMs passed.
absl::Status CheckHeld(const std::string& path, ShardWriter& w, Cloning& cloning, const std::atomic<bool>* hurry) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCloneHoldMs);
  while (!cloning.held.empty()) {
    const bool rush = hurry == nullptr || hurry->load() || std::chrono::steady_clock::now() > until;
    bool progressed = false;
    for (HeldLane& h : cloning.held) {
      for (; h.next < h.tiles.size(); ++h.next) {
        const HeldLane::Tile& t = h.tiles[h.next];
        const optim::KindSnapshot::TileCheck check = h.snapshot->Check(t.index);
        if (check.checked) {
          ++cloning.counts.checked_by_steps;
        } else if (rush || check.let_go_now) {
          STRATA_RETURN_IF_ERROR(ReadBack(path, w, t));
        } else {
          break;
        }
        h.snapshot->Skip(t.end);
        progressed = true;
      }
      if (h.next == h.tiles.size()) h.snapshot.reset();
    }
    std::erase_if(cloning.held, [](const HeldLane& h) { return h.snapshot == nullptr; });
    if (!progressed && !cloning.held.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteRanges(const std::string& path, int shard, int shard_world,
                                                          ShardSnapshot& snapshot, const std::atomic<bool>* hurry,
                                                          CloneCounts& counts, const CloneRoom& room) {
  STRATA_ASSIGN_OR_RETURN(ShardWriter w,
                          ShardWriter::Create(path, shard, shard_world, snapshot.ranges, snapshot.tiled));
  // Note [Cloned checkpoint lanes]: a clone's blocks take their room later, when the steps rewrite them (copy on
  // write): clone only where the file system has that room now, as a streamed save would need it, so a full disk
  // fails the save and not the step.
  // The ranks that share the file system share its room (CloneRoom, from SharedCloneRoom in a job's save).
  const uint64_t tiled_bytes = TiledBytes(snapshot);
  Cloning cloning;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const uint64_t free = room.free.value_or(offload::FreeBytes(dir.empty() ? "." : dir));
  const uint64_t need = room.need.value_or(tiled_bytes);
  cloning.on = free >= need;
  if (!cloning.on) {
    cloning.why_not = absl::StrCat("the file system has ", free, " bytes free, less than the ", need,
                                   " bytes the shards take once the steps rewrite the NVMe state's clones (",
                                   room.ranks == 1 ? "this rank's" : absl::StrCat(room.ranks, " ranks' on it"), ")");
  }
  cloning.held_need = snapshot.nvme_bytes();
  Sources sources;
  std::vector<float> piece;
  for (size_t i = 0; i < snapshot.ranges.size(); ++i) {
    const auto [buffer, offset] = snapshot.at[i];
    optim::KindSnapshot* lane = snapshot.lanes.size() > buffer ? snapshot.lanes[buffer].get() : nullptr;
    if (const int l = w.lane_of(i); l >= 0) {  // Note [NVMe lanes laid out as tiles]: the whole lane at its first range
      if (i != snapshot.tiled[l].first) continue;
      if (lane == nullptr) {
        STRATA_RETURN_IF_ERROR(w.WriteLane(l, snapshot.buffers[buffer].data(), snapshot.tiled[l].elems));
      } else {
        STRATA_RETURN_IF_ERROR(
            WriteTiledLane(path, w, l, snapshot.tiled[l], snapshot.lanes[buffer], cloning, sources, piece));
      }
    } else if (lane == nullptr) {
      STRATA_RETURN_IF_ERROR(w.Write(i, snapshot.buffers[buffer].data() + offset));
    } else {  // Note [Snapshots of NVMe state]: in file order, which is the lane's
      const uint64_t count = snapshot.ranges[i].count;
      piece.resize(std::min(count, kPieceFloats));
      uint64_t done = 0;
      do {
        const uint64_t n = std::min<uint64_t>(count - done, piece.size());
        if (n > 0) STRATA_RETURN_IF_ERROR(lane->Read(offset + done, n, piece.data()));
        STRATA_RETURN_IF_ERROR(w.WritePart(i, piece.data(), n));
        done += n;
      } while (done < count);
    }
    // A lane whose last range this was lets go of the rest of its tiles now.
    if (lane != nullptr && (i + 1 == snapshot.ranges.size() || snapshot.at[i + 1].first != buffer)) {
      snapshot.lanes[buffer].reset();
    }
  }
  absl::Status checked = CheckHeld(path, w, cloning, hurry);
  cloning.counts.read_back_bytes = w.read_back_bytes();
  counts = cloning.counts;
  STRATA_RETURN_IF_ERROR(checked);
  if (shard == 0 && !snapshot.tiled.empty()) {  // one line per save: whether the NVMe state was cloned
    if (cloning.on || cloning.bytes > 0) {
      STRATA_LOG(Info) << "checkpoint shard " << path << ": " << cloning.bytes << " of the NVMe state's " << tiled_bytes
                       << " bytes cloned from its tiles; of its " << cloning.counts.tiles << " tiles, "
                       << cloning.counts.checked_by_steps << " checked by the steps' reads and "
                       << cloning.counts.tiles - cloning.counts.checked_by_steps << " read back whole; "
                       << cloning.counts.read_back_bytes
                       << " bytes read back in all, the pieces for the ranges' CRCs included (decisions 0057, 0058)";
    } else {
      STRATA_LOG(Info) << "checkpoint shard " << path << ": NVMe state to be streamed, not cloned: " << cloning.why_not;
    }
  }
  return w.Finish();
}
}  // namespace

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteSnapshot(const std::string& path, int shard, int shard_world,
                                                            ShardSnapshot& snapshot, const std::atomic<bool>* hurry,
                                                            CloneCounts* counts, const CloneRoom& room) {
  CloneCounts mine;
  auto done = WriteRanges(path, shard, shard_world, snapshot, hurry, mine, room);
  if (counts != nullptr) *counts = mine;
  snapshot.lanes.clear();  // whatever happened: the live state writes those tiles in place again
  return done;
}

AsyncSaver::AsyncSaver(std::unique_ptr<comm::Communicator> control)
    : control_(std::move(control)), stream_(std::make_unique<device::HostStream>("checkpoint")) {}

AsyncSaver::~AsyncSaver() {
  Join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!reported_ && !outcome_.ok()) {
    STRATA_LOG(Error) << "an asynchronous checkpoint failed and nobody asked for its outcome: " << outcome_.message();
  }
}

void AsyncSaver::Join() {
  hurry_.store(true);  // Note [Cloned checkpoint lanes]: the training waits; held tiles are read back now
  if (thread_.joinable()) thread_.join();
}

absl::Status AsyncSaver::Start(AsyncSaveJob job) {
  STRATA_RETURN_IF_ERROR(Drain(job.step_dir));
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
    reported_ = false;
    hurry_.store(false);
    outcome_ = absl::OkStatus();
    last_ = {job.snapshot.bytes(), job.snapshot.nvme_bytes(), job.snapshot.staging_bytes(),
             job.snapshot.in_place_bytes()};
  }
  thread_ = std::thread([this, job = std::move(job)]() mutable { Run(std::move(job)); });
  return absl::OkStatus();
}

void AsyncSaver::Run(AsyncSaveJob job) {
  ShardReport mine;
  mine.shard = job.shard;
  CloneCounts clones;
  absl::Status local = job.local;
  if (BeforeWriteHook()) BeforeWriteHook()();
  // Note [Cloned checkpoint lanes]: every rank, a writer or not, tells the others what its shard takes on which
  // file system, so ranks that share one clone only where it holds all their shards, clones included.
  const bool writes = local.ok() && job.shard >= 0;
  absl::StatusOr<CloneRoom> room =
      SharedCloneRoom(*control_, *stream_, job.step_dir, writes ? TiledBytes(job.snapshot) : 0,
                      writes ? StreamedBytes(job.snapshot) : 0);
  if (!room.ok() && local.ok()) local = room.status();  // nothing written: the gather below reports it too
  if (local.ok() && job.shard >= 0) {
    auto done = WriteSnapshot((std::filesystem::path(job.step_dir) / ShardName(job.shard)).string(), job.shard,
                              job.shard_world, job.snapshot, &hurry_, &clones, *room);
    if (done.ok()) {
      mine.checksum = done->first;
      mine.bytes = done->second;
    } else {
      local = done.status();
    }
  }
  job.snapshot.lanes.clear();  // not written (a failure before): let go of the NVMe tiles before publishing
  {
    std::lock_guard<std::mutex> lock(mu_);
    spare_ = std::move(job.snapshot.buffers);  // for the next snapshot (TakeSpareBuffers)
    clones_ = clones;
  }
  absl::StatusOr<ShardReports> reports = GatherShardReports(*control_, *stream_, mine, local);
  absl::Status outcome = reports.status();
  if (reports.ok()) {
    // The manifest was built with the snapshot; it is used where the reports ask for it (rank 0).
    outcome = PublishCheckpoint(*control_, *stream_, job.step_dir, *reports, local, std::move(job.manifest));
  }
  std::lock_guard<std::mutex> lock(mu_);
  outcome_ = std::move(outcome);
  running_ = false;
}

absl::Status AsyncSaver::Wait() {
  Join();
  std::lock_guard<std::mutex> lock(mu_);
  reported_ = true;
  return outcome_;
}

void AsyncSaver::Settle() { Join(); }

absl::Status AsyncSaver::Drain(const std::string& next) {
  Join();
  absl::Status failure = Failure();
  if (failure.ok() || next.empty()) return failure;
  const std::string why = absl::StrCat("' not started: the asynchronous save before it failed: ", failure.message());
  return absl::Status(failure.code(), absl::StrCat("checkpoint '", next, why));
}

absl::Status AsyncSaver::Failure() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ || reported_ || outcome_.ok()) return absl::OkStatus();
  reported_ = true;
  absl::Status failure = outcome_;
  failure.SetPayload(kAsyncSaveFailure, absl::Cord("1"));
  return failure;
}

std::vector<std::vector<float>> AsyncSaver::TakeSpareBuffers() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(spare_, {});
}

CloneCounts AsyncSaver::last_clones() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clones_;
}

SnapshotBytes AsyncSaver::last_snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

bool AsyncSaver::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace strata::checkpoint
