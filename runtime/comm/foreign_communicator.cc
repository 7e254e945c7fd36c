#include "runtime/comm/foreign_communicator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/comm/job_watch.h"
#include "runtime/comm/stall_diagnosis.h"

namespace strata::comm {

absl::Status ForeignEndpoint::StoreSet(const std::string& key, const std::string& value) {
  static_cast<void>(key), static_cast<void>(value);
  return absl::UnimplementedError("this foreign communicator has no key-value store");
}

absl::StatusOr<std::optional<std::string>> ForeignEndpoint::StoreGet(const std::string& key) {
  static_cast<void>(key);
  return absl::UnimplementedError("this foreign communicator has no key-value store");
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Note [Foreign calls]. A trainer's collective blocks its calling thread until every rank joined, and the
// trainer's own deadline (gloo's process-group timeout) may be longer than Strata's or absent. So the
// endpoint is never called on a stream's worker: each foreign communicator has a thread of its own, the
// caller, which makes the endpoint's calls one at a time, and the worker (or the thread calling Dup or
// Split) waits for the call against the communicator's deadline, waking every kPoll:
//  - the call returns: its status is the collective's. A failure is sticky on the communicator (the trainer's
//    communicator is in an unknown state after it); a peer's notice that arrives within kNoticeAfterFailure
//    replaces it (the peer closed its transport as it failed), and a DeadlineExceeded one is diagnosed as below;
//  - a peer's failure notice appears in the store (Note [Failure notices]): the call has kNoticeGrace more
//    to return (a peer that failed right after joining leaves a collective that completes), else the wait
//    ends with the notice's AbortedError;
//  - the deadline passes: the liveness check of Note [Stall budget] runs over the store (every rank that
//    times out posts "alive/<world rank>" and reads the peers' posts for `liveness_ms`, once per job, as
//    the MPI back-end pings on its control communicator), the call has the rest of the timeout to return,
//    then the wait ends with DeadlineExceeded naming the ranks that did not respond (Note [Late answers]).
// A wait that ends while the call still runs abandons it: the communicator fails every later call at once
// with the same error, and the call may go on using the collective's buffers until the trainer's collective
// returns (its own timeout: strata.torch gives its gloo groups Strata's), as an MPI request abandoned at
// a deadline may (mpi_communicator.cc). The caller thread then owns the endpoint: a communicator destroyed
// while its call runs detaches the thread, which destroys the endpoint when the call returns.
constexpr auto kPoll = milliseconds(20);
constexpr auto kNoticeGrace = milliseconds(200);
constexpr auto kNoticeAfterFailure = milliseconds(1000);
constexpr size_t kNoticeBytes = 2048;  // a notice's longest text

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// What every communicator split off one root shares.
struct ForeignJob {
  int world_rank = 0;
  int world_size = 1;
  std::string prefix;  // "strata/<job id>/": this job's keys in the store
  std::mutex diag_mu;
  bool diag_done = false;
  std::vector<int64_t> answer_ms;  // the first liveness check's answers, by world rank
  int64_t waited_ms = 0;
};

// The caller thread's mailbox (Note [Foreign calls]): one call at a time.
struct CallerState {
  std::mutex mu;
  std::condition_variable cv;
  std::function<absl::Status()> call;  // set: a call to make
  bool running = false;
  bool done = false;  // the last call returned, with `result`
  absl::Status result;
  bool stop = false;
  std::shared_ptr<ForeignEndpoint> endpoint;  // set when a detached caller owns it
};

void CallerLoop(std::shared_ptr<CallerState> s) {
  for (;;) {
    std::function<absl::Status()> call;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->call != nullptr || s->stop; });
      if (s->call == nullptr) break;
      call = std::move(s->call);
      s->call = nullptr;
      s->running = true;
    }
    absl::Status r;
    try {
      r = call();
    } catch (...) {  // the endpoints never throw; a caller thread must not end the process if one does
      r = absl::InternalError("a foreign communicator's call threw a C++ exception");
    }
    call = nullptr;  // what it holds goes on this thread
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->running = false;
      s->done = true;
      s->result = std::move(r);
    }
    s->cv.notify_all();
  }
  std::shared_ptr<ForeignEndpoint> owned;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    owned = std::move(s->endpoint);
  }
  owned.reset();  // a detached caller's endpoint, destroyed after its last call (Note [Foreign calls])
}

// A Dup's or Split's new endpoint, handed from the caller thread to the waiting one (shared, since the wait
// may end first).
struct EndpointSlot {
  std::mutex mu;
  std::unique_ptr<ForeignEndpoint> endpoint;
};

class ForeignCommunicator final : public HostCommunicator {
 public:
  ForeignCommunicator(std::shared_ptr<ForeignJob> job, std::unique_ptr<ForeignEndpoint> endpoint, Options options,
                      std::string id)
      : job_(std::move(job)),
        ep_(std::move(endpoint)),
        options_(std::move(options)),
        id_(std::move(id)),
        rank_(ep_->rank()),
        size_(ep_->size()),
        caller_(std::make_shared<CallerState>()),
        thread_(CallerLoop, caller_) {}

  ~ForeignCommunicator() override {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(caller_->mu);
      caller_->stop = true;
      busy = caller_->running || caller_->call != nullptr;
      if (busy) caller_->endpoint = std::move(ep_);
    }
    caller_->cv.notify_all();
    if (busy) {
      thread_.detach();  // Note [Foreign calls]: it destroys the endpoint when the call returns
    } else {
      thread_.join();
      ep_.reset();  // the trainer's destroy, on the thread destroying this communicator
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Options& options() const override { return options_; }

  // Every rank's world rank, all-gathered over the new communicator: a check that the trainer's
  // communicator has the ranks it says (distinct, the world's in order for the root) and carries data.
  absl::Status Start(bool root) {
    auto table = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(size_), -1);
    (*table)[static_cast<size_t>(rank_)] = job_->world_rank;
    if (size_ > 1) {
      auto ep = ep_;
      const int r = rank_;
      STRATA_RETURN_IF_ERROR(
          Await([ep, table, r] { return ep->AllGather(table->data() + r, table->data(), 2, DType::kF16); },
                "start-up all_gather"));
    }
    std::vector<char> seen(static_cast<size_t>(job_->world_size), 0);
    for (int q = 0; q < size_; ++q) {
      const int32_t w = (*table)[static_cast<size_t>(q)];
      const bool bad = w < 0 || w >= job_->world_size || seen[static_cast<size_t>(w)] || (root && w != q);
      if (bad) {
        const std::string who = absl::StrCat("'", options_.name, "' (rank ", rank_, " of ", size_, ")");
        return absl::InvalidArgumentError(absl::StrCat("the foreign communicator ", who, " is not what its ranks say: ",
                                                       "rank ", q, " reported world rank ", w, " (every rank must ",
                                                       "pass its own rank, each once, and the same size)"));
      }
      seen[static_cast<size_t>(w)] = 1;
    }
    return absl::OkStatus();
  }

  // The job id, rank 0's random 64 bits, broadcast over the root: the prefix of the job's store keys.
  absl::Status AgreeJobId() {
    auto id = std::make_shared<std::array<uint16_t, 4>>();
    if (rank_ == 0) {
      std::random_device rd;
      for (uint16_t& w : *id) w = static_cast<uint16_t>(rd());
    }
    if (size_ > 1) {
      auto ep = ep_;
      STRATA_RETURN_IF_ERROR(
          Await([ep, id] { return ep->Broadcast(id->data(), id->size(), DType::kF16, 0); }, "job id broadcast"));
    }
    uint64_t bits = 0;
    for (uint16_t w : *id) bits = (bits << 16) | w;
    job_->prefix = absl::StrFormat("strata/%016x/", bits);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    const uint64_t k = dups_++;
    auto slot = std::make_shared<EndpointSlot>();
    auto ep = ep_;
    const int64_t t = o.timeout_ms;
    STRATA_RETURN_IF_ERROR(Await(
        [ep, slot, t]() -> absl::Status {
          absl::StatusOr<std::unique_ptr<ForeignEndpoint>> made = ep->Dup(t);
          if (!made.ok()) return made.status();
          std::lock_guard<std::mutex> lock(slot->mu);
          slot->endpoint = std::move(*made);
          return absl::OkStatus();
        },
        absl::StrCat("dup #", k, " into '", name, "'")));
    std::unique_ptr<ForeignEndpoint> child = TakeSlot(*slot);
    if (child == nullptr || child->rank() != rank_ || child->size() != size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the foreign communicator's dup of '", options_.name, "' into '", name, "' returned ",
          child == nullptr ? std::string("nothing") : absl::StrCat("rank ", child->rank(), " of ", child->size()),
          "; a dup has the same ranks (rank ", rank_, " of ", size_, ")"));
    }
    return Child(std::move(child), std::move(o), absl::StrCat(id_, ".d", k));
  }

  // Every rank's (color, key) first travels in an all-gather, so a negative color anywhere fails every rank
  // alike and the trainer's split sees the whole partition (torch's split_group needs it); then the
  // endpoint's split, whose rank and size are checked against the partition.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override {
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    const uint64_t k = splits_++;
    const std::string what = absl::StrCat("split #", k, " of '", options_.name, "' into '", name, "'");
    auto table = std::make_shared<std::vector<int32_t>>(2 * static_cast<size_t>(size_));
    (*table)[2 * static_cast<size_t>(rank_)] = color;
    (*table)[2 * static_cast<size_t>(rank_) + 1] = key;
    auto ep = ep_;
    if (size_ > 1) {
      const int r = rank_;
      STRATA_RETURN_IF_ERROR(
          Await([ep, table, r] { return ep->AllGather(table->data() + 2 * r, table->data(), 4, DType::kF16); }, what));
    }
    std::vector<int> colors(static_cast<size_t>(size_)), keys(static_cast<size_t>(size_)), members;
    for (int r = 0; r < size_; ++r) {
      colors[static_cast<size_t>(r)] = (*table)[2 * static_cast<size_t>(r)];
      keys[static_cast<size_t>(r)] = (*table)[2 * static_cast<size_t>(r) + 1];
    }
    for (int r = 0; r < size_; ++r) {
      if (colors[static_cast<size_t>(r)] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", r, " passed color ",
                                                       colors[static_cast<size_t>(r)], "; colors must be >= 0"));
      }
      if (colors[static_cast<size_t>(r)] == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
    const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    const int want_size = static_cast<int>(members.size());
    auto slot = std::make_shared<EndpointSlot>();
    const int64_t t = o.timeout_ms;
    STRATA_RETURN_IF_ERROR(Await(
        [ep, slot, colors, keys, t]() -> absl::Status {
          absl::StatusOr<std::unique_ptr<ForeignEndpoint>> made = ep->Split(colors, keys, t);
          if (!made.ok()) return made.status();
          std::lock_guard<std::mutex> lock(slot->mu);
          slot->endpoint = std::move(*made);
          return absl::OkStatus();
        },
        what));
    std::unique_ptr<ForeignEndpoint> child = TakeSlot(*slot);
    if (child == nullptr || child->rank() != want_rank || child->size() != want_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the foreign communicator's split returned ",
          child == nullptr ? std::string("nothing") : absl::StrCat("rank ", child->rank(), " of ", child->size()),
          "; the ranks of color ", color, " ordered by (key, rank) make this rank ", want_rank, " of ", want_size));
    }
    return Child(std::move(child), std::move(o), absl::StrCat(id_, ".s", k, "c", color));
  }

  void Abort(const absl::Status& cause) override {
    NotifyFailure(cause);
    ep_->AbortJob(std::string(cause.message()));
    SetBroken(absl::AbortedError(absl::StrCat("rank ", job_->world_rank, " aborted the job: ", cause.message())));
  }

  // Note [Failure notices]: the cause under this communicator's key of the store, once.
  void NotifyFailure(const absl::Status& cause) override {
    if (size_ == 1 || !ep_->has_store()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (notified_) return;
      notified_ = true;
    }
    std::string text = absl::StrCat(job_->world_rank, "\n", cause.message());
    if (text.size() > kNoticeBytes) text.resize(kNoticeBytes);
    static_cast<void>(ep_->StoreSet(NoticeKey(), text));  // nothing more to do when the store fails too
  }

 protected:
  absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) override {
    if (size_ == 1) {
      if (send != recv && count > 0) std::memcpy(recv, send, count * DTypeBytes(dtype));
      return absl::OkStatus();
    }
    auto ep = ep_;
    return Await([=] { return ep->AllGather(send, recv, count, dtype); }, Label("all_gather", seq));
  }

  absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                uint64_t seq) override {
    if (size_ == 1) {
      if (count > 0) std::memcpy(recv, send, count * DTypeBytes(dtype));
      return absl::OkStatus();
    }
    auto ep = ep_;
    STRATA_RETURN_IF_ERROR(
        Await([=] { return ep->ReduceScatter(send, recv, count, dtype); }, Label("reduce_scatter", seq)));
    if (op == ReduceOp::kAvg) ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return absl::OkStatus();
  }

  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            uint64_t seq) override {
    if (size_ == 1) {
      if (send != recv && count > 0) std::memcpy(recv, send, count * DTypeBytes(dtype));
      return absl::OkStatus();
    }
    auto ep = ep_;
    STRATA_RETURN_IF_ERROR(Await([=] { return ep->AllReduce(send, recv, count, dtype); }, Label("all_reduce", seq)));
    if (op == ReduceOp::kAvg) ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return absl::OkStatus();
  }

  absl::Status RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of ", size_));
    }
    if (size_ == 1) return absl::OkStatus();
    auto ep = ep_;
    return Await([=] { return ep->Broadcast(buf, count, dtype, root); }, Label("broadcast", seq));
  }

  absl::Status RunBarrier(uint64_t seq) override {
    if (size_ == 1) return absl::OkStatus();
    auto ep = ep_;
    return Await([=] { return ep->Barrier(); }, Label("barrier", seq));
  }

 private:
  std::string Label(const char* what, uint64_t seq) const { return absl::StrCat(what, " #", seq); }
  std::string Where(const std::string& what) const {
    return absl::StrCat(what, " on '", options_.name, "' (rank ", rank_, " of ", size_, ")");
  }
  std::string NoticeKey() const { return absl::StrCat(job_->prefix, id_, "/notice"); }

  static std::unique_ptr<ForeignEndpoint> TakeSlot(EndpointSlot& slot) {
    std::lock_guard<std::mutex> lock(slot.mu);
    return std::move(slot.endpoint);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Child(std::unique_ptr<ForeignEndpoint> ep, Options o, std::string id) {
    auto c = std::make_unique<ForeignCommunicator>(job_, std::move(ep), std::move(o), std::move(id));
    STRATA_RETURN_IF_ERROR(c->Start(/*root=*/false));
    return std::unique_ptr<Communicator>(std::move(c));
  }

  void SetBroken(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = s;
  }

  // Waits until the caller thread's call returned or `until` passed; its status in the first case.
  std::optional<absl::Status> WaitDone(Clock::time_point until) {
    std::unique_lock<std::mutex> lock(caller_->mu);
    if (!caller_->cv.wait_until(lock, until, [&] { return caller_->done; })) return std::nullopt;
    return caller_->result;
  }

  // A peer's notice on this communicator (Note [Failure notices]), else OK. Read errors count as no notice:
  // the deadline still holds.
  absl::Status PollNotice(const std::string& where) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!noticed_.ok()) return noticed_;
    }
    if (std::optional<JobDeath> died = JobFailure()) {  // Note [Job watch]: a rank of the torchrun job died
      std::lock_guard<std::mutex> lock(mu_);
      if (noticed_.ok()) noticed_ = PeerFailure(where, died->rank, died->notice);
      return noticed_;
    }
    if (!ep_->has_store()) return absl::OkStatus();
    absl::StatusOr<std::optional<std::string>> got = ep_->StoreGet(NoticeKey());
    if (!got.ok() || !got->has_value()) return absl::OkStatus();
    const std::string& text = **got;
    const size_t nl = text.find('\n');
    const int sender = nl == std::string::npos ? -1 : std::atoi(text.substr(0, nl).c_str());
    if (sender == job_->world_rank) return absl::OkStatus();  // this rank's own
    absl::Status s = PeerFailure(where, sender, nl == std::string::npos ? text : text.substr(nl + 1));
    std::lock_guard<std::mutex> lock(mu_);
    if (noticed_.ok()) noticed_ = s;
    return noticed_;
  }

  // Note [Stall budget] over the store, once per job; the answers by world rank.
  std::string Diagnose(const StallBudget& budget, bool self_stopped) {
    if (!ep_->has_store()) {
      return "which ranks did not arrive is unknown: this foreign communicator has no key-value store (the C ABI's "
             "kv_set and kv_get) for a liveness check";
    }
    ForeignJob& j = *job_;
    std::lock_guard<std::mutex> lock(j.diag_mu);
    if (!j.diag_done) {
      absl::Status posted = ep_->StoreSet(absl::StrCat(j.prefix, "alive/", j.world_rank), "1");
      if (!posted.ok()) return absl::StrCat("the liveness check could not post this rank's answer: ", posted.message());
      std::vector<int64_t> answers(static_cast<size_t>(j.world_size), -1);
      const auto start = Clock::now();
      const auto end = start + milliseconds(budget.liveness_ms);
      int pending = j.world_size - 1;
      while (pending > 0 && Clock::now() <= end) {
        for (int p = 0; p < j.world_size; ++p) {
          if (p == j.world_rank || answers[static_cast<size_t>(p)] >= 0) continue;
          absl::StatusOr<std::optional<std::string>> got = ep_->StoreGet(absl::StrCat(j.prefix, "alive/", p));
          if (!got.ok()) return absl::StrCat("the liveness check could not read the store: ", got.status().message());
          if (got->has_value()) {
            answers[static_cast<size_t>(p)] = MsSince(start);
            --pending;
          }
        }
        if (pending > 0) std::this_thread::sleep_for(milliseconds(2));
      }
      j.answer_ms = std::move(answers);
      j.waited_ms = MsSince(start);
      j.diag_done = true;
    }
    return DescribeLiveness(j.answer_ms, j.world_rank, j.waited_ms, budget.late_ms, self_stopped);
  }

  // The trainer's call failed. A peer that failed first may have closed its end of the trainer's transport (gloo:
  // "Connection closed by peer") just before its notice reached the store: its notice, when one comes within
  // kNoticeAfterFailure, names the cause where the transport's error cannot (Note [Failure notices]).
  absl::Status AwaitNotice(const std::string& where) {
    if (size_ == 1 || !ep_->has_store()) return absl::OkStatus();
    const auto until = Clock::now() + kNoticeAfterFailure;
    for (;;) {
      if (absl::Status notice = PollNotice(where); !notice.ok()) return notice;
      if (Clock::now() >= until) return absl::OkStatus();
      std::this_thread::sleep_for(kPoll);
    }
  }

  // The trainer's call failed: its message, with the liveness check when it gave up on its peers.
  absl::Status Failed(const std::string& where, const absl::Status& s, const StallBudget& budget, int64_t max_gap_ms) {
    std::string text = absl::StrCat(where, " failed in the trainer's collective: ", s.message());
    if (absl::IsDeadlineExceeded(s)) {
      absl::StrAppend(&text, "; ", DescribeOwnStop(max_gap_ms, budget.late_ms),
                      Diagnose(budget, WasStopped(max_gap_ms, budget.late_ms)));
    }
    return absl::Status(s.code(), text);
  }

  // Note [Foreign calls]: hands `call` to the caller thread and waits for it.
  absl::Status Await(std::function<absl::Status()> call, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return broken_;
      if (!noticed_.ok()) return noticed_;
    }
    {
      std::lock_guard<std::mutex> lock(caller_->mu);
      if (caller_->running || caller_->call != nullptr) {  // unreachable: an abandoned call breaks the communicator
        return absl::InternalError(absl::StrCat(Where(what), ": the previous call of this communicator still runs"));
      }
      caller_->call = std::move(call);
      caller_->done = false;
    }
    caller_->cv.notify_all();
    const std::string where = Where(what);
    const StallBudget budget = SplitTimeout(options_.timeout_ms);
    const auto start = Clock::now();
    const auto deadline = start + milliseconds(budget.collective_ms);
    const auto end = start + milliseconds(options_.timeout_ms);
    auto last = start;
    Clock::duration max_gap{0};
    auto gap_ms = [&] { return std::chrono::duration_cast<milliseconds>(max_gap).count(); };
    std::string who;  // the liveness check's answer, once the deadline passed
    int64_t check_began_ms = -1;
    for (;;) {
      const auto limit = check_began_ms < 0 ? deadline : end;
      std::optional<absl::Status> result = WaitDone(std::min(last + kPoll, limit));
      if (result.has_value()) {
        if (result->ok()) return absl::OkStatus();
        if (absl::Status notice = AwaitNotice(where); !notice.ok()) {
          SetBroken(notice);
          return notice;
        }
        absl::Status s = Failed(where, *result, budget, gap_ms());
        SetBroken(s);
        return s;
      }
      const auto now = Clock::now();
      max_gap = std::max(max_gap, now - last);
      last = now;
      if (absl::Status notice = PollNotice(where); !notice.ok()) {
        std::optional<absl::Status> late = WaitDone(Clock::now() + kNoticeGrace);
        if (late.has_value() && late->ok()) return absl::OkStatus();  // it completed: the notice fails the next
        SetBroken(notice);
        return notice;
      }
      if (check_began_ms < 0 && now >= deadline) {
        check_began_ms = MsSince(start);
        who = DescribeOwnStop(gap_ms(), budget.late_ms) + Diagnose(budget, WasStopped(gap_ms(), budget.late_ms));
      } else if (check_began_ms >= 0 && now >= end) {
        break;
      }
    }
    absl::Status s =
        absl::DeadlineExceededError(absl::StrCat(where, " timed out: the trainer's collective had not returned after ",
                                                 MsSince(start), " ms (collective timeout ", options_.timeout_ms,
                                                 " ms; the liveness check began at ", check_began_ms, " ms): ", who));
    SetBroken(s);
    return s;
  }

  std::shared_ptr<ForeignJob> job_;
  std::shared_ptr<ForeignEndpoint> ep_;
  const Options options_;
  const std::string id_;  // "w", "w.d0", "w.d0.s1c0", ...: the same on every rank of this communicator
  const int rank_;
  const int size_;
  std::shared_ptr<CallerState> caller_;
  std::thread thread_;
  uint64_t dups_ = 0, splits_ = 0;  // numbered as made; identical across ranks (Dup and Split are collective)
  std::mutex mu_;
  absl::Status broken_;   // sticky: a failed or abandoned call
  absl::Status noticed_;  // a peer's notice
  bool notified_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateForeignCommunicator(std::unique_ptr<ForeignEndpoint> endpoint,
                                                                        const Options& options) {
  if (endpoint == nullptr) return absl::InvalidArgumentError("the foreign endpoint is null");
  const int n = endpoint->size(), r = endpoint->rank();
  if (n < 1 || r < 0 || r >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the foreign communicator says it is rank ", r, " of ", n, "; a rank is in [0, size)"));
  }
  auto job = std::make_shared<ForeignJob>();
  job->world_rank = r;
  job->world_size = n;
  auto comm = std::make_unique<ForeignCommunicator>(job, std::move(endpoint), options, "w");
  STRATA_RETURN_IF_ERROR(comm->AgreeJobId());
  STRATA_RETURN_IF_ERROR(comm->Start(/*root=*/true));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace strata::comm
