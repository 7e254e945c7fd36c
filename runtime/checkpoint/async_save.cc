#include "runtime/checkpoint/async_save.h"

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

absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteSnapshot(const std::string& path, int shard, int shard_world,
                                                            const ShardSnapshot& snapshot) {
  STRATA_ASSIGN_OR_RETURN(ShardWriter w, ShardWriter::Create(path, shard, shard_world, snapshot.ranges));
  for (size_t i = 0; i < snapshot.ranges.size(); ++i) {
    const auto [buffer, offset] = snapshot.at[i];
    STRATA_RETURN_IF_ERROR(w.Write(i, snapshot.buffers[buffer].data() + offset));
  }
  return w.Finish();
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

bool AsyncSaver::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace strata::checkpoint
