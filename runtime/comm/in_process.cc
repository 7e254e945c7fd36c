#include "runtime/comm/in_process.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/host_communicator.h"

namespace strata::comm {
namespace {

// What one rank asked for; all ranks of one collective must agree.
struct OpDesc {
  std::string kind;
  size_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  bool operator==(const OpDesc&) const = default;
  std::string Describe() const { return absl::StrCat(kind, "(count=", count, ", ", DTypeName(dtype), ")"); }
};

struct PendingOp {
  std::vector<OpDesc> desc;
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<bool> arrived;
  int num_arrived = 0;
  int num_departed = 0;
  absl::Status failed;  // set by the first rank that timed out; late arrivals fail with it
};

// What every group split off one in-process world shares: one lock and one wake-up for all their
// rendezvous, and the job's abort, which fails the collectives of every group.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  absl::Status aborted;
};

struct Rendezvous;

// One Split() call of a group: every rank's (color, key), then the new groups, made by the first rank
// that sees everyone arrived.
struct PendingSplit {
  std::vector<int> color, key;
  std::vector<bool> arrived;
  int num_arrived = 0;
  int num_departed = 0;
  absl::Status failed;  // set by the first rank that timed out
  std::map<int, std::shared_ptr<Rendezvous>> groups;  // by color
};

struct Rendezvous {
  Rendezvous(int n, std::shared_ptr<Job> j) : world(n), job(std::move(j)), dups(n, 0), splits(n, 0) {}
  const int world;
  const std::shared_ptr<Job> job;
  std::map<std::pair<int, uint64_t>, PendingOp> ops;  // keyed by (channel, seq)
  std::vector<int> dups;                               // Dup() calls made by each rank
  std::vector<int> splits;                             // Split() calls made by each rank
  std::map<int, PendingSplit> pending_splits;          // keyed by the call's index
  std::map<int, absl::Status> notices;                 // Note [Failure notices], by channel: the first one
};

class InProcessCommunicator final : public HostCommunicator {
 public:
  InProcessCommunicator(std::shared_ptr<Rendezvous> rv, int rank, int channel, Options options)
      : rv_(std::move(rv)), rank_(rank), channel_(channel), options_(std::move(options)) {}

  int rank() const override { return rank_; }
  int size() const override { return rv_->world; }
  const Options& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    int index;
    {
      std::lock_guard<std::mutex> lock(rv_->job->mu);
      index = ++rv_->dups[rank_];
    }
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<Communicator>(new InProcessCommunicator(rv_, rank_, index, std::move(o)));
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override;

  void Abort(const absl::Status& cause) override {
    {
      std::lock_guard<std::mutex> lock(rv_->job->mu);
      if (rv_->job->aborted.ok()) {
        rv_->job->aborted = absl::AbortedError(absl::StrCat("rank ", rank_, " aborted the job: ", cause.message()));
      }
    }
    rv_->job->cv.notify_all();
  }

  void NotifyFailure(const absl::Status& cause) override {
    {
      std::lock_guard<std::mutex> lock(rv_->job->mu);
      if (rv_->notices.count(channel_) > 0) return;
      rv_->notices[channel_] = PeerFailure(absl::StrCat("a collective on '", options_.name, "'"), rank_,
                                           std::string(cause.message()));
    }
    rv_->job->cv.notify_all();
  }

 protected:
  absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) override;
  absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                uint64_t seq) override;
  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            uint64_t seq) override;
  absl::Status RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) override;
  absl::Status RunBarrier(uint64_t seq) override;

 private:
  // Deposits this rank's buffers and waits for every rank. On success `*op` points at the shared entry.
  absl::Status Arrive(uint64_t seq, const OpDesc& desc, const void* send, void* recv, PendingOp** op);
  // Waits until every rank finished reading the peers' buffers; the last one out erases the entry.
  absl::Status Depart(uint64_t seq, const OpDesc& desc);
  // A peer's notice on this channel (Note [Failure notices]), else OK. Called with the job's lock held.
  absl::Status Noticed() const {
    auto it = rv_->notices.find(channel_);
    return it == rv_->notices.end() ? absl::OkStatus() : it->second;
  }
  std::string Label(uint64_t seq, const OpDesc& desc) const {
    return absl::StrCat(desc.kind, " #", seq, " on '", options_.name, "' (rank ", rank_, ")");
  }

  std::shared_ptr<Rendezvous> rv_;
  const int rank_;
  const int channel_;
  const Options options_;
};

absl::Status InProcessCommunicator::Arrive(uint64_t seq, const OpDesc& desc, const void* send, void* recv,
                                           PendingOp** out) {
  std::unique_lock<std::mutex> lock(rv_->job->mu);
  if (!rv_->job->aborted.ok()) return rv_->job->aborted;
  PendingOp& op = rv_->ops[{channel_, seq}];
  if (op.arrived.empty()) {
    op.desc.resize(rv_->world);
    op.send.resize(rv_->world);
    op.recv.resize(rv_->world);
    op.arrived.assign(rv_->world, false);
  }
  if (!op.failed.ok()) return op.failed;
  op.desc[rank_] = desc;
  op.send[rank_] = send;
  op.recv[rank_] = recv;
  op.arrived[rank_] = true;
  ++op.num_arrived;
  rv_->job->cv.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const bool all = rv_->job->cv.wait_until(lock, deadline, [&] {
    return op.num_arrived == rv_->world || !rv_->job->aborted.ok() || !op.failed.ok() || !Noticed().ok();
  });
  if (!rv_->job->aborted.ok()) return rv_->job->aborted;
  if (!op.failed.ok()) return op.failed;
  if (op.num_arrived < rv_->world && !Noticed().ok()) {  // Note [Failure notices]
    op.failed = Noticed();  // so that a rank arriving after us fails too instead of waiting for our departure
    rv_->job->cv.notify_all();
    return op.failed;
  }
  if (!all) {
    std::vector<int> missing, present;
    for (int r = 0; r < rv_->world; ++r) (op.arrived[r] ? present : missing).push_back(r);
    op.failed = absl::DeadlineExceededError(absl::StrCat(
        Label(seq, desc), " timed out after ", options_.timeout_ms, " ms waiting for rank(s) ",
        absl::StrJoin(missing, ","), " (dead, stopped or stuck before this collective); rank(s) ",
        absl::StrJoin(present, ","), " arrived"));
    rv_->job->cv.notify_all();
    return op.failed;
  }
  for (int r = 0; r < rv_->world; ++r) {
    if (!(op.desc[r] == desc)) {
      return absl::InvalidArgumentError(absl::StrCat("collective mismatch at ", Label(seq, desc), ": rank ",
                                                     rank_, " called ", desc.Describe(), " but rank ", r,
                                                     " called ", op.desc[r].Describe()));
    }
  }
  *out = &op;
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::Depart(uint64_t seq, const OpDesc& desc) {
  std::unique_lock<std::mutex> lock(rv_->job->mu);
  auto it = rv_->ops.find({channel_, seq});
  PendingOp& op = it->second;
  ++op.num_departed;
  rv_->job->cv.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const bool all =
      rv_->job->cv.wait_until(lock, deadline, [&] { return op.num_departed >= rv_->world || !rv_->job->aborted.ok(); });
  if (!rv_->job->aborted.ok()) return rv_->job->aborted;
  if (!all) return absl::DeadlineExceededError(absl::StrCat(Label(seq, desc), " timed out while peers read buffers"));
  // The last rank to see everyone departed erases the entry.
  if (++op.num_departed == 2 * rv_->world) rv_->ops.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> InProcessCommunicator::Split(int color, int key, const std::string& name,
                                                                           int64_t timeout_ms) {
  Job& job = *rv_->job;
  const int n = rv_->world;
  std::unique_lock<std::mutex> lock(job.mu);
  if (!job.aborted.ok()) return job.aborted;
  const int index = rv_->splits[rank_]++;
  PendingSplit& call = rv_->pending_splits[index];
  if (call.arrived.empty()) {
    call.color.assign(n, 0);
    call.key.assign(n, 0);
    call.arrived.assign(n, false);
  }
  if (!call.failed.ok()) return call.failed;
  call.color[rank_] = color;
  call.key[rank_] = key;
  call.arrived[rank_] = true;
  ++call.num_arrived;
  job.cv.notify_all();
  const std::string label =
      absl::StrCat("split #", index, " of '", options_.name, "' into '", name, "' (rank ", rank_, ")");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const bool all = job.cv.wait_until(lock, deadline, [&] {
    return call.num_arrived == n || !job.aborted.ok() || !call.failed.ok();
  });
  if (!job.aborted.ok()) return job.aborted;
  if (!call.failed.ok()) return call.failed;
  if (!all) {
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      if (!call.arrived[r]) missing.push_back(r);
    }
    call.failed = absl::DeadlineExceededError(absl::StrCat(label, " timed out after ", options_.timeout_ms,
                                                           " ms waiting for rank(s) ", absl::StrJoin(missing, ","),
                                                           " (dead, stopped or stuck before this split)"));
    job.cv.notify_all();
    return call.failed;
  }
  // Every rank sees the same colors, so a bad one fails every rank alike.
  absl::Status bad;
  std::vector<int> members;  // of this rank's color, in (key, rank) order
  for (int r = 0; r < n; ++r) {
    if (call.color[r] < 0 && bad.ok()) {
      bad = absl::InvalidArgumentError(absl::StrCat(label, ": rank ", r, " passed color ", call.color[r],
                                                    "; colors must be >= 0"));
    }
    if (call.color[r] == color) members.push_back(r);
  }
  if (bad.ok() && call.groups.empty()) {
    std::map<int, int> sizes;
    for (int c : call.color) ++sizes[c];
    for (const auto& [c, size] : sizes) call.groups[c] = std::make_shared<Rendezvous>(size, rv_->job);
  }
  std::shared_ptr<Rendezvous> group = bad.ok() ? call.groups[color] : nullptr;
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return call.key[a] < call.key[b]; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  if (++call.num_departed == n) rv_->pending_splits.erase(index);
  if (!bad.ok()) return bad;
  Options o = options_;
  o.name = name;
  if (timeout_ms > 0) o.timeout_ms = timeout_ms;
  return std::unique_ptr<Communicator>(new InProcessCommunicator(std::move(group), new_rank, 0, std::move(o)));
}

absl::Status InProcessCommunicator::RunAllGather(const void* send, void* recv, size_t count, DType dtype,
                                                 uint64_t seq) {
  const OpDesc desc{"all_gather", count, dtype};
  PendingOp* op = nullptr;
  absl::Status s = Arrive(seq, desc, send, recv, &op);
  if (!s.ok()) return s;
  const size_t block = count * DTypeBytes(dtype);
  for (int r = 0; r < rv_->world; ++r) {
    char* dst = static_cast<char*>(recv) + r * block;
    if (dst != op->send[r] && block > 0) std::memcpy(dst, op->send[r], block);
  }
  return Depart(seq, desc);
}

absl::Status InProcessCommunicator::RunReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                                     ReduceOp rop, uint64_t seq) {
  const OpDesc desc{"reduce_scatter", count, dtype, 0, rop};
  PendingOp* op = nullptr;
  absl::Status s = Arrive(seq, desc, send, recv, &op);
  if (!s.ok()) return s;
  const size_t block = count * DTypeBytes(dtype);
  std::vector<char> acc(block);
  for (int r = 0; r < rv_->world; ++r) {
    const char* src = static_cast<const char*>(op->send[r]) + rank_ * block;
    if (r == 0) {
      if (block > 0) std::memcpy(acc.data(), src, block);
    } else {
      AccumulateInto(acc.data(), src, count, dtype);
    }
  }
  if (rop == ReduceOp::kAvg) ScaleInPlace(acc.data(), count, dtype, 1.0f / static_cast<float>(rv_->world));
  s = Depart(seq, desc);
  if (s.ok() && block > 0) std::memcpy(recv, acc.data(), block);
  return s;
}

absl::Status InProcessCommunicator::RunAllReduce(const void* send, void* recv, size_t count, DType dtype,
                                                 ReduceOp rop, uint64_t seq) {
  const OpDesc desc{"all_reduce", count, dtype, 0, rop};
  PendingOp* op = nullptr;
  absl::Status s = Arrive(seq, desc, send, recv, &op);
  if (!s.ok()) return s;
  const size_t bytes = count * DTypeBytes(dtype);
  std::vector<char> acc(bytes);
  if (bytes > 0) std::memcpy(acc.data(), op->send[0], bytes);
  for (int r = 1; r < rv_->world; ++r) AccumulateInto(acc.data(), op->send[r], count, dtype);
  if (rop == ReduceOp::kAvg) ScaleInPlace(acc.data(), count, dtype, 1.0f / static_cast<float>(rv_->world));
  s = Depart(seq, desc);  // peers may still read our send (== recv when in place) until here
  if (s.ok() && bytes > 0) std::memcpy(recv, acc.data(), bytes);
  return s;
}

absl::Status InProcessCommunicator::RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) {
  const OpDesc desc{"broadcast", count, dtype, root};
  if (root < 0 || root >= rv_->world) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of ", rv_->world));
  }
  PendingOp* op = nullptr;
  absl::Status s = Arrive(seq, desc, buf, buf, &op);
  if (!s.ok()) return s;
  const size_t bytes = count * DTypeBytes(dtype);
  if (rank_ != root && bytes > 0) std::memcpy(buf, op->send[root], bytes);
  return Depart(seq, desc);
}

absl::Status InProcessCommunicator::RunBarrier(uint64_t seq) {
  const OpDesc desc{"barrier"};
  PendingOp* op = nullptr;
  absl::Status s = Arrive(seq, desc, nullptr, nullptr, &op);
  if (!s.ok()) return s;
  return Depart(seq, desc);
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int world_size, const Options& options) {
  auto rv = std::make_shared<Rendezvous>(world_size, std::make_shared<Job>());
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<InProcessCommunicator>(rv, r, 0, options));
  return out;
}

}  // namespace strata::comm
