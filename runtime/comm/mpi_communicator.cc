#include "runtime/comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common/element_math.h"
#include "runtime/base/logging.h"
#include "runtime/base/mpi_call.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/comm/stall_diagnosis.h"

namespace strata::comm {

// Shared by the runtime and every communicator made from it; frees its MPI objects when the last holder
// goes, unless MPI was finalised first (then they are gone with it).
struct MpiContext {
  ~MpiContext() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (bf16_sum != MPI_OP_NULL) MPI_Op_free(&bf16_sum);
    if (fp16_sum != MPI_OP_NULL) MPI_Op_free(&fp16_sum);
    if (control != MPI_COMM_NULL && !diag_done) MPI_Comm_free(&control);
  }
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op fp16_sum = MPI_OP_NULL;
  MPI_Comm control = MPI_COMM_NULL;  // liveness exchange after a timeout
  int world_rank = 0;
  int world_size = 1;
  std::mutex diag_mu;
  bool diag_done = false;
  std::vector<int64_t> diag_answer_ms;  // the first timeout's liveness answers (DescribeLiveness)
  int64_t diag_waited_ms = 0;
};

namespace {

constexpr int kDiagTag = 7001;
constexpr int kReduceTag = 7002;  // the reduce-scatter's transfers (Note [Reduce-scatter over point to point])
constexpr size_t kReduceChunkBytes = 1u << 20;  // per peer and transfer
constexpr int kMaxDirectRanks = 8;                // above it: 2 (size - 1) MiB of buffers is too much
constexpr int kNoticeTag = 7003;                  // Note [Failure notices]: "<world rank>\n<cause>"
constexpr int kNoticeBytes = 2048;                // a notice's longest text (below every eager limit)
constexpr int kNoticeGraceMs = 200;               // a noticed collective is still polled this long

void Bf16SumOp(void* in, void* inout, int* len, MPI_Datatype*) {
  AccumulateInto(inout, in, static_cast<size_t>(*len), DType::kBF16);
}
void Fp16SumOp(void* in, void* inout, int* len, MPI_Datatype*) {
  AccumulateInto(inout, in, static_cast<size_t>(*len), DType::kF16);
}

MPI_Datatype MpiType(DType t) { return t == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

// Asks every peer once, on the control communicator, whether it is alive, and waits `grace_ms` for the
// answers, recording when each arrives (Note [Late answers] in stall_diagnosis.h). Process-wide once:
// later timeouts reuse the first answers (each words them with its own stop, Note [Own stop]).
std::string DiagnoseOnce(MpiContext& ctx, int64_t grace_ms, int64_t late_ms, bool self_stopped) {
  std::lock_guard<std::mutex> lock(ctx.diag_mu);
  const int me = ctx.world_rank;
  if (ctx.diag_done) return DescribeLiveness(ctx.diag_answer_ms, me, ctx.diag_waited_ms, late_ms, self_stopped);
  const int n = ctx.world_size;
  std::vector<long long> mine(1, me), theirs(n, -1);
  std::vector<MPI_Request> sends, recvs(n, MPI_REQUEST_NULL);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    MPI_Request r;
    MPI_Isend(mine.data(), 1, MPI_LONG_LONG, p, kDiagTag, ctx.control, &r);
    sends.push_back(r);
    MPI_Irecv(&theirs[p], 1, MPI_LONG_LONG, p, kDiagTag, ctx.control, &recvs[p]);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(grace_ms);
  auto ms_since_start = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  };
  // Every peer is polled on each pass, so each arrival time is measured to about a millisecond.
  std::vector<int64_t> answer_ms(n, -1);
  int pending = n - 1;
  while (pending > 0 && std::chrono::steady_clock::now() <= deadline) {
    for (int p = 0; p < n; ++p) {
      if (p == me || answer_ms[p] >= 0) continue;
      int flag = 0;
      MPI_Test(&recvs[p], &flag, MPI_STATUS_IGNORE);
      if (flag) {
        answer_ms[p] = ms_since_start();
        --pending;
      }
    }
    if (pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request& r : sends) MPI_Request_free(&r);
  ctx.diag_answer_ms = answer_ms;
  ctx.diag_waited_ms = ms_since_start();
  ctx.diag_done = true;
  return DescribeLiveness(answer_ms, me, ctx.diag_waited_ms, late_ms, self_stopped);
}

class MpiCommunicator final : public HostCommunicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiContext> ctx, MPI_Comm comm, Options options)
      : ctx_(std::move(ctx)), comm_(comm), options_(std::move(options)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (size_ > 1) MPI_Irecv(notice_in_, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, kNoticeTag, comm_, &notice_req_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (notice_req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&notice_req_);
      MPI_Wait(&notice_req_, MPI_STATUS_IGNORE);
    }
    // A notice sent is a small eager message, done at once; one still pending after 200 ms is cancelled,
    // and its text left to it (not freed) in case MPI still reads it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    int done = notice_sends_.empty();
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Testall(static_cast<int>(notice_sends_.size()), notice_sends_.data(), &done, MPI_STATUSES_IGNORE);
    }
    if (!done) {
      for (MPI_Request& r : notice_sends_) {
        if (r == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
      static_cast<void>(notice_out_.release());
    }
    // Note [Failure notices]: after a failure, messages of collectives this rank or a peer abandoned may still
    // arrive; a freed communicator's context id would be reused by the next one made, whose collectives
    // could match them. So a communicator that saw a failure is left allocated (one per failure).
    if (comm_ != MPI_COMM_NULL && !abandoned_) MPI_Comm_free(&comm_);
  }

  // Note [Failure notices]: the cause to every peer on kNoticeTag, once; WaitWithDeadline polls for it.
  void NotifyFailure(const absl::Status& cause) override {
    std::lock_guard<std::mutex> lock(notice_mu_);
    if (notice_out_ != nullptr || size_ == 1) return;
    abandoned_ = true;
    std::string text = absl::StrCat(ctx_->world_rank, "\n", cause.message());
    if (text.size() > static_cast<size_t>(kNoticeBytes)) text.resize(kNoticeBytes);
    notice_out_ = std::make_unique<char[]>(text.size());
    std::memcpy(notice_out_.get(), text.data(), text.size());
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(notice_out_.get(), static_cast<int>(text.size()), MPI_CHAR, p, kNoticeTag, comm_, &r) ==
          MPI_SUCCESS) {
        notice_sends_.push_back(r);
      }
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Options& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    MPI_Comm dup = MPI_COMM_NULL;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(comm_, &dup)));
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<Communicator>(new MpiCommunicator(ctx_, dup, std::move(o)));
  }

  // Every rank's (color, key) first travels in a deadline-bounded all-gather, so a rank that never calls
  // Split is a timeout naming it, not a hang in MPI_Comm_split (which has no deadline), and a negative
  // color anywhere fails every rank alike; then MPI_Comm_split, which every rank has reached.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override {
    std::vector<int> mine = {color, key}, all(2 * static_cast<size_t>(size_));
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(
        STRATA_MPI_CALL(MPI_Iallgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &req)));
    STRATA_RETURN_IF_ERROR(WaitWithDeadline(req, "split", splits_++));
    for (int r = 0; r < size_; ++r) {
      if (all[2 * r] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("Split('", name, "') of '", options_.name, "': rank ", r,
                                                       " passed color ", all[2 * r], "; colors must be >= 0"));
      }
    }
    MPI_Comm part = MPI_COMM_NULL;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_split(comm_, color, key, &part)));
    MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN);
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<Communicator>(new MpiCommunicator(ctx_, part, std::move(o)));
  }

  void Abort(const absl::Status& cause) override {
    STRATA_LOG(Error) << "aborting the job: " << cause.message();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 protected:
  absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) override {
    STRATA_RETURN_IF_ERROR(CheckCount(count, "all_gather"));
    const bool in_place = send == static_cast<const char*>(recv) + rank_ * count * DTypeBytes(dtype);
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count),
                                                          MpiType(dtype), recv, static_cast<int>(count),
                                                          MpiType(dtype), comm_, &req)));
    return WaitWithDeadline(req, "all_gather", seq);
  }

  // Note [Reduce-scatter over point to point]. Open MPI 4.1's MPI_Ireduce_scatter_block (libnbc) reduces
  // the whole buffer on rank 0, into a temporary as large as the send buffer, and scatters from there:
  // measured, a 150 MiB reduce-scatter at 2 ranks raised rank 0's VmHWM by 150 MiB, and rank 0 did all
  // the additions. So each rank gathers its own block instead, a chunk at a time: it sends every peer
  // that peer's chunk, receives its own chunk from every peer into `rs_buf_`, and sums the contributions
  // in rank order (0, 1, ..., as InProcessCommunicator does), so each rank adds 1/size of the buffer,
  // the extra memory is 2 * (size - 1) chunks (the next chunk's transfers are posted before the current
  // one is summed), and the sum is the same whatever the transport. The chunks share one deadline
  // (WaitClock), and a chunk shorter than expected is a count mismatch naming the sender. Measured with
  // `strata bench comm` (docs/perf-notes.md): 2.8-4.2x MPI's bandwidth for buffers of 4-128 MiB at 2-4
  // ranks, but 0.7x at 64 KiB, where latency rules; so blocks below one chunk still go to MPI's
  // collective, whose temporary is then under size MiB. At 2 ranks a + b == b + a, so the result is bit
  // for bit the MPI collective's; at more ranks the order of the sum differs from MPI's (within the
  // equivalence tests' tolerance), and small blocks keep MPI's order (`scripts/demo`'s gpt2-tiny at 4
  // ranks gives the same losses as before). The direct exchange suits a node's worth of ranks: its
  // buffers and messages grow with the world, so beyond kMaxDirectRanks (a multi-node job) MPI's
  // collective stays (docs/decisions/0022). Collectives of one communicator run one at a time (the
  // contract of Communicator), so one buffer serves them.
  absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                uint64_t seq) override {
    const size_t esz = DTypeBytes(dtype);
    if (size_ == 1) {
      if (count > 0) std::memcpy(recv, send, count * esz);
    } else if (!Direct(count * esz)) {
      STRATA_RETURN_IF_ERROR(CheckCount(count, "reduce_scatter"));
      MPI_Request req;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Ireduce_scatter_block(
          send, recv, static_cast<int>(count), MpiType(dtype), SumOp(dtype), comm_, &req)));
      STRATA_RETURN_IF_ERROR(WaitWithDeadline(req, "reduce_scatter", seq));
    } else {
      WaitClock clock(SplitTimeout(options_.timeout_ms));
      STRATA_RETURN_IF_ERROR(DirectReduce(static_cast<const char*>(send), static_cast<char*>(recv), size_ * count,
                                          count, dtype, "reduce_scatter", seq, clock));
    }
    if (op == ReduceOp::kAvg) ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return absl::OkStatus();
  }

  // Note [All-reduce over point to point]: for the same reason (MPI_Iallreduce in place on 150 MiB raised
  // every rank's VmHWM by 150 MiB at 2 ranks), a large all-reduce is the direct reduce-scatter above over
  // blocks of ceil(count / size) (the last ones shorter or empty), into this rank's block of `recv`, then
  // MPI_Iallgatherv in place. Each element is summed in rank order on the rank that owns its block, so
  // every rank ends with the same bits (at 2 ranks, MPI's bits). One deadline covers both phases.
  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            uint64_t seq) override {
    const size_t esz = DTypeBytes(dtype), block = (count + size_ - 1) / size_;
    if (size_ == 1 || !Direct(block * esz)) {
      STRATA_RETURN_IF_ERROR(CheckCount(count, "all_reduce"));
      MPI_Request req;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv,
                                                            static_cast<int>(count), MpiType(dtype), SumOp(dtype),
                                                            comm_, &req)));
      STRATA_RETURN_IF_ERROR(WaitWithDeadline(req, "all_reduce", seq));
      if (op == ReduceOp::kAvg) ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
      return absl::OkStatus();
    }
    STRATA_RETURN_IF_ERROR(CheckCount(count, "all_reduce"));  // the gather's displacements are ints
    WaitClock clock(SplitTimeout(options_.timeout_ms));
    char* out = static_cast<char*>(recv);
    const auto [mine, mine_len] = BlockOf(count, block, rank_);
    STRATA_RETURN_IF_ERROR(DirectReduce(static_cast<const char*>(send), out + mine * esz, count, block, dtype,
                                        "all_reduce", seq, clock));
    if (op == ReduceOp::kAvg) ScaleInPlace(out + mine * esz, mine_len, dtype, 1.0f / static_cast<float>(size_));
    std::vector<int> counts(size_), displs(size_);
    for (int r = 0; r < size_; ++r) {
      const auto [first, len] = BlockOf(count, block, r);
      displs[r] = static_cast<int>(first);
      counts[r] = static_cast<int>(len);
    }
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallgatherv(MPI_IN_PLACE, 0, MpiType(dtype), recv, counts.data(),
                                                           displs.data(), MpiType(dtype), comm_, &req)));
    return WaitWithDeadline(&req, 1, MPI_STATUSES_IGNORE, "all_reduce", seq, clock);
  }

  absl::Status RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) override {
    STRATA_RETURN_IF_ERROR(CheckCount(count, "broadcast"));
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of ", size_));
    }
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(
        STRATA_MPI_CALL(MPI_Ibcast(buf, static_cast<int>(count), MpiType(dtype), root, comm_, &req)));
    return WaitWithDeadline(req, "broadcast", seq);
  }

  absl::Status RunBarrier(uint64_t seq) override {
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Ibarrier(comm_, &req)));
    return WaitWithDeadline(req, "barrier", seq);
  }

 private:
  MPI_Op SumOp(DType t) const {
    return t == DType::kF32 ? MPI_SUM : (t == DType::kBF16 ? ctx_->bf16_sum : ctx_->fp16_sum);
  }

  absl::Status CheckCount(size_t count, const char* what) const {
    if (count > static_cast<size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of ", count, " elements exceeds MPI's int count; "
                                                     "split the unit"));
    }
    return absl::OkStatus();
  }

  // One collective's deadline and poll record. A collective that waits more than once (the
  // reduce-scatter's chunks) keeps one across its waits, so its deadline is the collective's, and a stop
  // between two waits (posting, summing) is a gap like any other (Note [Own stop]).
  struct WaitClock {
    explicit WaitClock(const StallBudget& b)
        : start(std::chrono::steady_clock::now()), deadline(start + std::chrono::milliseconds(b.collective_ms)),
          last_poll(start) {}
    std::chrono::steady_clock::time_point start, deadline, last_poll;
    std::chrono::steady_clock::duration max_gap{0};
    bool regraced = false;
  };

  // Block r of `total` elements in blocks of `block`: its first element and its length (the last
  // blocks shorter or empty).
  static std::pair<size_t, size_t> BlockOf(size_t total, size_t block, int r) {
    const size_t first = std::min(total, r * block);
    return {first, std::min(block, total - first)};
  }

  // Note [Reduce-scatter over point to point]: whether a block of `block_bytes` goes the direct way.
  bool Direct(size_t block_bytes) const { return block_bytes >= kReduceChunkBytes && size_ <= kMaxDirectRanks; }

  // The direct exchange over `total` elements of every rank's `in`, in blocks of `block`: block r is
  // elements [r * block, min((r + 1) * block, total)). The rank-order sum of this rank's block lands
  // in `out`, which may be that block of `in` itself (in place).
  absl::Status DirectReduce(const char* in, char* out, size_t total, size_t block, DType dtype, const char* what,
                            uint64_t seq, WaitClock& clock) {
    const size_t esz = DTypeBytes(dtype);
    auto len_of = [&](int r) { return BlockOf(total, block, r).second; };
    const int peers = size_ - 1;
    const size_t chunk = kReduceChunkBytes / esz, chunk_bytes = chunk * esz;
    auto chunks_of = [&](int r) { return (len_of(r) + chunk - 1) / chunk; };
    size_t chunks = 0;
    for (int r = 0; r < size_; ++r) chunks = std::max(chunks, chunks_of(r));
    const char* own = in + BlockOf(total, block, rank_).first * esz;  // this rank's part of its own block
    const bool in_place = out == own;
    const size_t need = (2 * static_cast<size_t>(peers) + (in_place ? 1 : 0)) * chunk_bytes;
    if (rs_buf_bytes_ < need) {
      rs_buf_ = std::make_unique<char[]>(need);
      rs_buf_bytes_ = need;
    }
    auto peer = [&](int i) { return (rank_ + 1 + i) % size_; };  // the i-th peer, staggered by rank
    auto from = [&](int set, int i) { return rs_buf_.get() + (static_cast<size_t>(set) * peers + i) * chunk_bytes; };
    char* saved = rs_buf_.get() + 2 * static_cast<size_t>(peers) * chunk_bytes;  // in place: own chunk, kept
    std::vector<MPI_Request> reqs(4 * static_cast<size_t>(peers), MPI_REQUEST_NULL);  // per set: recvs, sends
    auto piece = [&](int r, size_t c) {  // elements of chunk c of block r
      const size_t len = len_of(r), first = c * chunk;
      return first >= len ? size_t{0} : std::min(chunk, len - first);
    };
    auto post = [&](size_t c) -> absl::Status {
      const int set = static_cast<int>(c % 2);
      MPI_Request* r = reqs.data() + static_cast<size_t>(set) * 2 * peers;
      for (int i = 0; i < peers; ++i) {
        const int q = peer(i);
        if (const size_t n = piece(rank_, c); n > 0) {
          STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Irecv(from(set, i), static_cast<int>(n), MpiType(dtype), q,
                                                           kReduceTag, comm_, &r[i])));
        }
        if (const size_t n = piece(q, c); n > 0) {
          const char* theirs = in + (static_cast<size_t>(q) * block + c * chunk) * esz;
          STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Isend(theirs, static_cast<int>(n), MpiType(dtype), q, kReduceTag,
                                                           comm_, &r[peers + i])));
        }
      }
      return absl::OkStatus();
    };
    std::vector<MPI_Status> statuses(2 * static_cast<size_t>(peers));
    absl::Status s = chunks > 0 ? post(0) : absl::OkStatus();
    for (size_t c = 0; s.ok() && c < chunks; ++c) {
      if (c + 1 < chunks) s = post(c + 1);
      const int set = static_cast<int>(c % 2);
      if (s.ok())
        s = WaitWithDeadline(reqs.data() + static_cast<size_t>(set) * 2 * peers, 2 * peers, statuses.data(), what, seq,
                             clock);
      if (!s.ok()) break;
      const size_t n = piece(rank_, c), first = c * chunk;
      if (n == 0) continue;
      for (int i = 0; i < peers && s.ok(); ++i) {  // a peer with a smaller count sends a shorter chunk
        int got = 0;
        MPI_Get_count(&statuses[i], MpiType(dtype), &got);
        if (static_cast<size_t>(got) != n) {
          s = absl::InvalidArgumentError(
              absl::StrCat(what, " #", seq, " on '", options_.name, "' (rank ", rank_, " of ", size_, "): rank ",
                           peer(i), " sent ", got, " elements at element ", first,
                           " of the block where this rank expects ", n, ": the ranks disagree on the count"));
        }
      }
      if (!s.ok()) break;
      char* dst = out + first * esz;
      const char* mine = own + first * esz;
      if (in_place && rank_ > 0) {  // the sum writes dst before it reads this rank's own part
        std::memcpy(saved, mine, n * esz);
        mine = saved;
      }
      for (int r = 0; r < size_; ++r) {
        const char* src = r == rank_ ? mine : from(set, (r - rank_ - 1 + size_) % size_);
        if (r == 0) {
          if (dst != src) std::memcpy(dst, src, n * esz);
        } else {
          AccumulateInto(dst, src, n, dtype);
        }
      }
    }
    if (!s.ok()) {
      // Receives still posted are cancelled, so no later transfer on this communicator can match them;
      // they and the posted sends may still touch the buffers meanwhile (the sends read `in`, as an MPI
      // collective's would after a failure), so the buffer is left to them, not freed.
      for (int set = 0; set < 2; ++set) {
        for (int i = 0; i < peers; ++i) {
          MPI_Request& r = reqs[static_cast<size_t>(set) * 2 * peers + i];
          if (r == MPI_REQUEST_NULL) continue;
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
      }
      static_cast<void>(rs_buf_.release());
      rs_buf_bytes_ = 0;
    }
    return s;
  }

  // Polls `reqs` until all complete or the deadline passes. MPI's non-blocking collectives (libnbc) advance
  // only inside MPI calls, so a sleeping poller starves them: measured with `strata bench comm`, sleeping
  // up to 200 us between tests ran a 128 MiB all-gather at 0.06-0.27 of raw MPI. The loop therefore
  // keeps testing, yielding the core between tests (as a blocking MPI wait busy-polls too), and only
  // backs off to short sleeps after a full second without completion: a wait that long is a stall, not
  // a transfer, and the back-off keeps a stalled rank from burning a core until its deadline.
  // Note [Stall budget]: the collective is waited for until the liveness check must start, so that the
  // error comes when the configured timeout has passed. Note [Own stop]: the largest gap between polls
  // tells whether this rank itself was stopped meanwhile.
  absl::Status WaitWithDeadline(MPI_Request& req, const char* what, uint64_t seq) {
    WaitClock clock(SplitTimeout(options_.timeout_ms));
    return WaitWithDeadline(&req, 1, MPI_STATUSES_IGNORE, what, seq, clock);
  }
  absl::Status WaitWithDeadline(MPI_Request* reqs, int n, MPI_Status* statuses, const char* what, uint64_t seq,
                                WaitClock& clock) {
    const StallBudget budget = SplitTimeout(options_.timeout_ms);
    const auto start = clock.start;
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::seconds(1);  // per wait
    while (true) {
      int flag = 0;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Testall(n, reqs, &flag, statuses)));
      if (flag) return absl::OkStatus();
      STRATA_RETURN_IF_ERROR(AfterNotice(reqs, n, statuses, what, seq));
      const auto now = std::chrono::steady_clock::now();
      const auto gap = now - clock.last_poll;
      clock.max_gap = std::max(clock.max_gap, gap);
      clock.last_poll = now;
      if (now > clock.deadline) {
        // Resumed past the deadline (Note [Own stop]): the peers may have done their part meanwhile, and
        // one test need not finish a collective of several rounds, so poll `late_ms` more, once.
        if (clock.regraced || gap <= std::chrono::milliseconds(budget.late_ms)) break;
        clock.regraced = true;
        clock.deadline = now + std::chrono::milliseconds(budget.late_ms);
      }
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    const int64_t waited_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    const int64_t max_gap_ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock.max_gap).count();
    const std::string who =
        DescribeOwnStop(max_gap_ms, budget.late_ms) +
        DiagnoseOnce(*ctx_, budget.liveness_ms, budget.late_ms, WasStopped(max_gap_ms, budget.late_ms));
    // A diagnosis made earlier by another collective returns at once: the rest of the timeout is still this one's.
    const auto end = start + std::chrono::milliseconds(options_.timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      int flag = 0;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Testall(n, reqs, &flag, statuses)));
      if (flag) return absl::OkStatus();
      STRATA_RETURN_IF_ERROR(AfterNotice(reqs, n, statuses, what, seq));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const int64_t total_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    abandoned_ = true;
    return absl::DeadlineExceededError(absl::StrCat(
        what, " #", seq, " on '", options_.name, "' (rank ", rank_, " of ", size_, ") timed out: not complete after ",
        total_ms, " ms (collective timeout ", options_.timeout_ms, " ms; the liveness check began at ", waited_ms,
        " ms): ", who));
  }

  // A peer's notice (Note [Failure notices]) as the error of the collective being waited for, else OK. Only
  // the thread that waits (the communicator's one user at a time) tests the request; a notice stays.
  absl::Status PollNotice(const char* what, uint64_t seq) {
    if (!noticed_.ok() || notice_req_ == MPI_REQUEST_NULL) return noticed_;
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&notice_req_, &flag, &st) != MPI_SUCCESS || !flag) return absl::OkStatus();
    int len = 0;
    MPI_Get_count(&st, MPI_CHAR, &len);
    const std::string text(notice_in_, static_cast<size_t>(std::max(len, 0)));
    const size_t nl = text.find('\n');
    int sender = st.MPI_SOURCE;
    if (nl != std::string::npos) sender = std::atoi(text.substr(0, nl).c_str());
    noticed_ = PeerFailure(absl::StrCat(what, " #", seq, " on '", options_.name, "' (rank ", rank_, " of ", size_, ")"),
                           sender, nl == std::string::npos ? text : text.substr(nl + 1));
    return noticed_;
  }

  // Called between polls of an incomplete collective: OK unless a peer's notice has come. Then the collective
  // is still polled for up to kNoticeGraceMs: a peer that fails right after completing its part (say, on
  // what this very collective told it) leaves a collective that completes on every live rank, and returning
  // before MPI has written the receive buffer would let MPI write it after its owner freed it. Complete:
  // OK (the notice fails the next collective). Else the notice's error, and the communicator is abandoned.
  absl::Status AfterNotice(MPI_Request* reqs, int n, MPI_Status* statuses, const char* what, uint64_t seq) {
    absl::Status notice = PollNotice(what, seq);
    if (notice.ok()) return notice;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kNoticeGraceMs);
    while (std::chrono::steady_clock::now() < until) {
      int flag = 0;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Testall(n, reqs, &flag, statuses)));
      if (flag) return absl::OkStatus();
      std::this_thread::yield();
    }
    abandoned_ = true;
    return notice;
  }

  std::shared_ptr<MpiContext> ctx_;
  MPI_Comm comm_;
  const Options options_;
  std::atomic<bool> abandoned_{false};          // a collective was given up, or a notice sent: never freed
  MPI_Request notice_req_ = MPI_REQUEST_NULL;  // Note [Failure notices]: the posted receive
  char notice_in_[kNoticeBytes] = {};
  absl::Status noticed_;
  std::mutex notice_mu_;                        // NotifyFailure may be called from any thread
  std::unique_ptr<char[]> notice_out_;          // the text sent (set once)
  std::vector<MPI_Request> notice_sends_;
  int rank_ = 0;
  int size_ = 1;
  uint64_t splits_ = 0;  // numbers the Split exchanges in errors
  std::unique_ptr<char[]> rs_buf_;  // Note [Reduce-scatter over point to point]
  size_t rs_buf_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MpiRuntime>> MpiRuntime::Init(int* argc, char*** argv) {
  int initialized = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Initialized(&initialized)));
  if (initialized) return absl::FailedPreconditionError("MPI is already initialised in this process");
  int provided = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided)));
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return absl::FailedPreconditionError(absl::StrCat(
        "this MPI provides thread level ", provided, ", but strata needs MPI_THREAD_MULTIPLE (each stream issues "
        "collectives from its own thread); rebuild or choose an MPI with thread-multiple support"));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<MpiContext> ctx, MakeContext());
  return std::unique_ptr<MpiRuntime>(new MpiRuntime(std::move(ctx), /*owns_mpi=*/true));
}

absl::StatusOr<std::shared_ptr<MpiContext>> MpiRuntime::MakeContext() {
  auto ctx = std::make_shared<MpiContext>();
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_rank(MPI_COMM_WORLD, &ctx->world_rank)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &ctx->world_size)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Op_create(&Bf16SumOp, /*commute=*/1, &ctx->bf16_sum)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Op_create(&Fp16SumOp, /*commute=*/1, &ctx->fp16_sum)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &ctx->control)));
  SetLogRank(ctx->world_rank);
  return ctx;
}

absl::StatusOr<bool> MpiRuntime::IsInitialized() {
  int initialized = 0, finalized = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Initialized(&initialized)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Finalized(&finalized)));
  if (finalized)
    return absl::FailedPreconditionError("MPI was already finalised in this process; it cannot be used again");
  return initialized != 0;
}

absl::StatusOr<std::unique_ptr<MpiRuntime>> MpiRuntime::Adopt() {
  STRATA_ASSIGN_OR_RETURN(const bool initialized, IsInitialized());
  if (!initialized) {
    return absl::FailedPreconditionError("MPI is not initialised: initialise it with MPI_THREAD_MULTIPLE first");
  }
  int provided = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Query_thread(&provided)));
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI was initialised with thread level ", provided, ", but strata needs MPI_THREAD_MULTIPLE (each stream "
        "issues collectives from its own thread): initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)"));
  }
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<MpiContext> ctx, MakeContext());
  return std::unique_ptr<MpiRuntime>(new MpiRuntime(std::move(ctx), /*owns_mpi=*/false));
}

int MpiRuntime::WorldFortranHandle() { return static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)); }

absl::StatusOr<std::unique_ptr<Communicator>> MpiRuntime::Wrap(int fortran_handle, const Options& options) {
  const MPI_Comm host = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  if (host == MPI_COMM_NULL) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fortran handle ", fortran_handle, " names MPI_COMM_NULL, not a communicator"));
  }
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(host, &dup)));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(ctx_, dup, options));
}

MpiRuntime::~MpiRuntime() {
  if (!owns_mpi_) return;
  ctx_.reset();  // frees the ops and the control communicator unless a communicator still holds them
  MPI_Finalize();
}

void MpiRuntime::AbortJob(const std::string& reason) {
  STRATA_LOG(Error) << "aborting the job: " << reason;
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // MPI_Abort does not return; if it did, this process still must not go on
}

// Note [Start-up agreement]. A rank that cannot start (a bad flag on one rank of an MPMD launch, a config
// file missing on one node) used to leave its peers in the world communicator's MPI_Comm_dup, which has no
// deadline: the job hung, and only the failing rank said why. Every command that starts a job first
// gathers each rank's start-up error here, with a deadline, so every rank knows who failed and why, prints
// it, and all end cleanly; a rank that never arrives makes the others end the job at the deadline.
absl::StatusOr<std::vector<std::string>> MpiRuntime::GatherStartErrors(const std::string& mine, int64_t timeout_ms) {
  constexpr size_t kBytes = 1024;  // one error line each, cut to fit
  const int n = ctx_->world_size;
  // Owned by the exchange: left allocated if it is abandoned at the deadline (MPI may still write them).
  auto send = std::make_unique<char[]>(kBytes);
  auto recv = std::make_unique<char[]>(kBytes * n);
  std::memset(send.get(), 0, kBytes);
  std::memcpy(send.get(), mine.data(), std::min(mine.size(), kBytes - 1));
  MPI_Request req = MPI_REQUEST_NULL;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallgather(send.get(), static_cast<int>(kBytes), MPI_CHAR, recv.get(),
                                                        static_cast<int>(kBytes), MPI_CHAR, ctx_->control, &req)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int done = 0; !done;) {
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Test(&req, &done, MPI_STATUS_IGNORE)));
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      static_cast<void>(send.release());
      static_cast<void>(recv.release());
      return absl::DeadlineExceededError(absl::StrCat(
          "not every rank reached the end of start-up within ", timeout_ms / 1000.0, " s (a rank is stuck, or died "
          "before it; its own output says why)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r] = std::string(recv.get() + r * kBytes, strnlen(recv.get() + r * kBytes, kBytes));
  return out;
}

int MpiRuntime::world_rank() const { return ctx_->world_rank; }
int MpiRuntime::world_size() const { return ctx_->world_size; }

absl::StatusOr<std::unique_ptr<Communicator>> MpiRuntime::World(const Options& options) {
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &dup)));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(ctx_, dup, options));
}

}  // namespace strata::comm
