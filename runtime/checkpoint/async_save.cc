#include "runtime/checkpoint/async_save.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
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

// What a save's clones came to (Note [Cloned checkpoint lanes] in files.h), for its log line.
struct Cloning {
  bool on = false;      // cloning; turned off for the rest of the save by the first refusal
  uint64_t bytes = 0;   // cloned
  std::string why_not;  // why it streamed, where it did
};

// Note [Cloned checkpoint lanes] (files.h): the whole blocks of lane `l` cloned from the files of its tiles,
// tile by tile, each let go once cloned; then the rest (the last partial block, or all of it where the file
// systems cannot clone) streamed from the snapshot.
absl::Status WriteTiledLane(const std::string& path, ShardWriter& w, size_t l, const ShardLane& lane,
                            optim::KindSnapshot& snap, Cloning& cloning, Sources& sources, std::vector<float>& piece) {
  const uint64_t whole = lane.elems * 4 / kBlock * kBlock;  // the lane's bytes in whole blocks
  const std::optional<optim::LaneFiles> files = cloning.on ? snap.Files() : std::nullopt;
  if (files.has_value() && files->tile_elems * 4 % kBlock != 0) {
    cloning.on = false;
    cloning.why_not = absl::StrCat("NVMe tiles of ", files->tile_elems, " elements are not whole 4096-byte blocks");
  }
  if (files.has_value() && cloning.on) {
    uint64_t at = 0;  // the lane's bytes cloned so far
    for (size_t t = 0; t < files->tiles.size() && at < whole && cloning.on; ++t) {
      uint32_t crc = 0;  // of the tile's bytes cloned
      for (const optim::LanePiece& p : files->tiles[t]) {
        if (at >= whole) break;
        const uint64_t n = std::min(p.bytes, whole - at);
        const absl::StatusOr<int> fd = sources.Open(p);  // a file it cannot open is one it cannot clone from
        const absl::Status cloned =
            fd.ok() ? w.CloneLane(l, *fd, p.name, p.offset, n, &crc) : absl::UnimplementedError("");
        if (absl::IsUnimplemented(cloned)) {
          cloning.on = false;
          cloning.why_not = std::string(fd.ok() ? cloned.message() : fd.status().message());
          break;
        }
        STRATA_RETURN_IF_ERROR(cloned);
        at += n;
        cloning.bytes += n;
      }
      // A tile cloned whole is checked against the store's checksum of it, as a read through the store would be
      // (a tile cloned in part is read whole through the store, below, which checks it).
      const uint64_t tile_end = std::min<uint64_t>((t + 1) * files->tile_elems, lane.elems) * 4;
      if (at == tile_end && files->crcs[t].has_value() && crc != *files->crcs[t] && !files->tiles[t].empty()) {
        const optim::LanePiece& p = files->tiles[t].front();
        return absl::DataLossError(absl::StrCat("checkpoint ", path, ": NVMe tile ", t, " of a lane (", p.name,
                                                " at offset ", p.offset, ") fails its checksum: stored crc32 0x",
                                                absl::Hex(*files->crcs[t]), ", read 0x", absl::Hex(crc)));
      }
      snap.Skip(at / 4);
    }
  }
  for (uint64_t done = w.lane_done(l); done < lane.elems;) {
    const uint64_t n = std::min<uint64_t>(lane.elems - done, kPieceFloats);
    piece.resize(n);
    STRATA_RETURN_IF_ERROR(snap.Read(done, n, piece.data()));
    STRATA_RETURN_IF_ERROR(w.WriteLane(l, piece.data(), n));
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteRanges(const std::string& path, int shard, int shard_world,
                                                          ShardSnapshot& snapshot) {
  STRATA_ASSIGN_OR_RETURN(ShardWriter w,
                          ShardWriter::Create(path, shard, shard_world, snapshot.ranges, snapshot.tiled));
  // Note [Cloned checkpoint lanes]: a clone's blocks take their room later, when the steps rewrite them (copy on
  // write): clone only where the file system has that room now, as a streamed save would need it, so a full disk
  // fails the save and not the step.
  uint64_t tiled_bytes = 0;
  for (const ShardLane& l : snapshot.tiled) tiled_bytes += l.elems * 4;
  Cloning cloning;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const uint64_t free = offload::FreeBytes(dir.empty() ? "." : dir);
  cloning.on = free >= tiled_bytes;
  if (!cloning.on) {
    cloning.why_not = absl::StrCat("the file system has ", free, " bytes free, less than the ", tiled_bytes,
                                   " bytes of NVMe state a clone takes once the steps rewrite it");
  }
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
        STRATA_RETURN_IF_ERROR(WriteTiledLane(path, w, l, snapshot.tiled[l], *lane, cloning, sources, piece));
        snapshot.lanes[buffer].reset();  // its tiles, and its staging, let go at once
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
  if (shard == 0 && !snapshot.tiled.empty()) {  // one line per save: whether the NVMe state was cloned
    if (cloning.on || cloning.bytes > 0) {
      STRATA_LOG(Info) << "checkpoint shard " << path << ": " << cloning.bytes << " of the NVMe state's " << tiled_bytes
                       << " bytes cloned from its tiles (decision 0057)";
    } else {
      STRATA_LOG(Info) << "checkpoint shard " << path << ": NVMe state copied, not cloned: " << cloning.why_not;
    }
  }
  return w.Finish();
}
}  // namespace

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteSnapshot(const std::string& path, int shard, int shard_world,
                                                            ShardSnapshot& snapshot) {
  auto done = WriteRanges(path, shard, shard_world, snapshot);
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
  if (thread_.joinable()) thread_.join();
}

absl::Status AsyncSaver::Start(AsyncSaveJob job) {
  STRATA_RETURN_IF_ERROR(Drain(job.step_dir));
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
    reported_ = false;
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
  absl::Status local = job.local;
  if (BeforeWriteHook()) BeforeWriteHook()();
  if (local.ok() && job.shard >= 0) {
    auto done = WriteSnapshot((std::filesystem::path(job.step_dir) / ShardName(job.shard)).string(), job.shard,
                              job.shard_world, job.snapshot);
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

SnapshotBytes AsyncSaver::last_snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

bool AsyncSaver::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace strata::checkpoint
