#include "runtime/checkpoint/async_save.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/publish.h"
#include "runtime/device/host_device.h"

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

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteRanges(const std::string& path, int shard, int shard_world,
                                                          ShardSnapshot& snapshot) {
  STRATA_ASSIGN_OR_RETURN(ShardWriter w, ShardWriter::Create(path, shard, shard_world, snapshot.ranges));
  std::vector<float> piece;
  for (size_t i = 0; i < snapshot.ranges.size(); ++i) {
    const auto [buffer, offset] = snapshot.at[i];
    optim::KindSnapshot* lane = snapshot.lanes.size() > buffer ? snapshot.lanes[buffer].get() : nullptr;
    if (lane == nullptr) {
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
