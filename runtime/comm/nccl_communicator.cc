#include "runtime/comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda_device.h"

namespace strata::comm {
namespace {

absl::Status NcclError(const char* call, ncclResult_t r, const char* file, int line) {
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ", ncclGetErrorString(r)));
}

#define STRATA_NCCL_CALL(call)                                                                 \
  ([&]() -> ::absl::Status {                                                                   \
    const ncclResult_t strata_nccl_r_ = (call);                                                \
    if (strata_nccl_r_ != ncclSuccess) return NcclError(#call, strata_nccl_r_, __FILE__, __LINE__); \
    return ::absl::OkStatus();                                                                 \
  }())

ncclDataType_t NcclType(DType t) {
  return t == DType::kF32 ? ncclFloat32 : (t == DType::kBF16 ? ncclBfloat16 : ncclFloat16);
}

// Note [Nonblocking NCCL]. Every communicator Strata creates is nonblocking (ncclConfig_t::blocking = 0):
// initialisation, split and finalisation return at once with ncclInProgress, and a blocking NCCL call
// would otherwise wait forever for a rank that never arrives (its bootstrap has no deadline). So each
// call is followed by Settle(), which polls ncclCommGetAsyncError until the state leaves ncclInProgress
// or the deadline passes, and then aborts the communicator. Collectives may return ncclInProgress too
// (connections are set up at first use); they are settled before their completion event is recorded,
// since until then the kernel may not be on the stream yet.
ncclConfig_t NonblockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// The state of `comm`: what ncclCommGetAsyncError says (see the Note), or its own failure.
ncclResult_t StateOf(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r == ncclSuccess ? state : r;
}

// Polls `comm`'s state after a call on it that returned `issued`. OK once the state is ncclSuccess; the
// NCCL error, or DeadlineExceeded after `timeout_ms`, otherwise. Does not abort: the caller decides.
absl::Status Settle(ncclComm_t comm, ncclResult_t issued, const std::string& what, int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete within ", timeout_ms, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    state = StateOf(comm);
  }
  if (state == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", ncclGetErrorString(state), " (", ncclGetLastError(nullptr),
                                          ")"));
}

// The communicator handle, shared by the communicator and its pending collectives. One lock covers every
// use of the communicator: issuing a call and settling it (Issue), polling its state and aborting it,
// since ncclCommGetAsyncError is not a plain read and ncclCommAbort frees the communicator. Once aborted
// nobody polls it or destroys it again. The last owner finalises it (waiting for every issued
// collective, within the deadline) and destroys it, or aborts it when the finalisation does not settle.
class NcclHandle {
 public:
  NcclHandle(ncclComm_t comm, int64_t timeout_ms) : comm_(comm), timeout_ms_(timeout_ms) {}
  ~NcclHandle() {
    FreeWhenDone free_barrier{barrier_};  // after the communicator, which pending barriers may still use
    if (aborted_) return;
    if (Settle(comm_, ncclCommFinalize(comm_), "ncclCommFinalize", timeout_ms_).ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  // Runs `call(comm)`, an NCCL call on this communicator, and settles it (Note [Nonblocking NCCL]); a
  // failure aborts the communicator. Aborted, without calling, when it was aborted before.
  template <typename Call>
  absl::Status Issue(Call&& call, const std::string& what, int64_t timeout_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_)
      return absl::AbortedError(absl::StrCat(what, ": the communicator was aborted after an earlier failure"));
    absl::Status st = Settle(comm_, call(comm_), what, timeout_ms);
    if (!st.ok()) AbortLocked();
    return st;
  }
  // The asynchronous state: ncclSuccess, ncclInProgress while a call settles, or the error;
  // ncclInvalidUsage once aborted.
  ncclResult_t AsyncError() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_ ? ncclInvalidUsage : StateOf(comm_);
  }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    AbortLocked();
  }
  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  // The one device element Barrier reduces, allocated at first use; nullptr when cudaMalloc fails. It
  // lives as long as the handle, which pending barriers hold.
  float* barrier_element() {
    std::lock_guard<std::mutex> lock(mu_);
    if (barrier_ == nullptr && cudaMalloc(&barrier_, sizeof(float)) != cudaSuccess) barrier_ = nullptr;
    return barrier_;
  }

 private:
  struct FreeWhenDone {
    float* p;
    ~FreeWhenDone() { cudaFree(p); }
  };
  void AbortLocked() {
    if (aborted_) return;
    ncclCommAbort(comm_);
    aborted_ = true;
  }

  const ncclComm_t comm_;
  const int64_t timeout_ms_;
  std::mutex mu_;
  bool aborted_ = false;
  float* barrier_ = nullptr;  // barrier_element()
};

// A communicator fresh from a nonblocking init (`issued` is what the call returned), settled within
// `timeout_ms`; aborted, and the failure annotated with `what`, when it does not settle.
absl::Status SettleNew(ncclComm_t comm, ncclResult_t issued, const std::string& what, int64_t timeout_ms) {
  if (issued != ncclSuccess && issued != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::InternalError(absl::StrCat(what, " failed: ", ncclGetErrorString(issued)));
  }
  absl::Status st = Settle(comm, issued, what, timeout_ms);
  if (!st.ok()) ncclCommAbort(comm);
  return st;
}

// Splits a communicator (Dup, or adopting the caller's) into one over the same ranks, ordered by `key`.
// With a nonblocking parent the split runs as a job of the parent's, which writes the child into the
// output slot when it finishes, possibly after ncclCommSplit returned ncclSuccess; until then the
// parent's state is ncclInProgress. So the slot is heap memory that outlives the call, the parent is
// settled first (`settle_parent` runs the split and settles it: NcclHandle::Issue for ours), then the
// child. On a failure, once the slot is final, a child the split made is aborted: after any failure
// when `settle_parent` aborts the parent then (ours); else the deadline may have passed with the
// parent's job still running, which may yet write the slot, so the slot is left to it (not freed).
// `color` selects the ranks of the child (Communicator::Split); a Dup is color 0 on every rank.
template <typename SettleParent>
absl::StatusOr<ncclComm_t> SplitNccl(int color, int key, SettleParent&& settle_parent, bool aborts_parent,
                                 const std::string& what, int64_t timeout_ms) {
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  const absl::Status st = settle_parent([out = slot.get(), color, key](ncclComm_t parent) {
    ncclConfig_t config = NonblockingConfig();
    const ncclResult_t r = ncclCommSplit(parent, color, key, out, &config);
    return r == ncclSuccess ? ncclInProgress : r;  // done only when the parent's state says so
  });
  if (!st.ok()) {
    if (!aborts_parent && absl::IsDeadlineExceeded(st)) {
      slot.release();  // NOLINT: still the parent's job's to write
    } else if (*slot != nullptr) {
      ncclCommAbort(*slot);
    }
    return st;
  }
  if (*slot == nullptr)
    return absl::InternalError(absl::StrCat(what, ": ncclCommSplit settled without a communicator"));
  STRATA_RETURN_IF_ERROR(SettleNew(*slot, ncclInProgress, what, timeout_ms));
  return *slot;
}

// Completion of one collective: polls the CUDA event and the communicator's asynchronous error against
// the deadline; aborts the communicator on a timeout or an error (Note: NCCL cannot say which peer).
class NcclDone final : public device::Event {
 public:
  NcclDone(std::unique_ptr<device::CudaEvent> e, std::shared_ptr<NcclHandle> comm, std::string what,
           int64_t timeout_ms)
      : event_(std::move(e)), comm_(std::move(comm)), what_(std::move(what)), timeout_ms_(timeout_ms) {}
  explicit NcclDone(absl::Status failed) : failed_(std::move(failed)) {}

  absl::Status Synchronize() override {
    if (!failed_.ok()) return failed_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (!event_->Query()) {
      if (comm_->aborted()) {
        failed_ = absl::AbortedError(absl::StrCat(what_, ": the communicator was aborted after an earlier failure"));
        return failed_;
      }
      const ncclResult_t async = comm_->AsyncError();  // ncclInProgress: another call is settling
      if ((async != ncclSuccess && async != ncclInProgress) || std::chrono::steady_clock::now() > deadline) {
        comm_->Abort();
        failed_ =
            async != ncclSuccess && async != ncclInProgress
                ? absl::InternalError(absl::StrCat(what_, ": NCCL asynchronous error: ", ncclGetErrorString(async)))
                : absl::DeadlineExceededError(absl::StrCat(what_, " timed out after ", timeout_ms_,
                                                           " ms (a peer is dead or stuck); communicator aborted"));
        return failed_;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return event_->Synchronize();
  }
  bool Query() override { return !failed_.ok() || event_->Query(); }
  int64_t completed_ns() const override { return 0; }
  // A stream waits for the collective's device event; a collective that failed before reaching the
  // device has none, and a stream waiting for it fails with its status (CudaStream::WaitFor).
  Event& waitable() override { return event_ != nullptr ? static_cast<Event&>(*event_) : *this; }

 private:
  std::unique_ptr<device::CudaEvent> event_;
  std::shared_ptr<NcclHandle> comm_;
  std::string what_;
  int64_t timeout_ms_ = 0;
  absl::Status failed_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, Options o)
      : handle_(std::make_shared<NcclHandle>(comm, o.timeout_ms)), rank_(rank), size_(size), options_(std::move(o)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Options& options() const override { return options_; }
  bool device_buffers() const override { return true; }

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& s) override {
    Count(Collective::kAllGather, count, dtype);
    return Run("all_gather", s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllGather(send, recv, count, NcclType(dtype), c, cs);
    });
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     device::Stream& s) override {
    Count(Collective::kReduceScatter, count, dtype);
    return Run("reduce_scatter", s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclReduceScatter(send, recv, count, NcclType(dtype), op == ReduceOp::kAvg ? ncclAvg : ncclSum, c, cs);
    });
  }
  Work AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, device::Stream& s) override {
    Count(Collective::kAllReduce, count, dtype);
    return Run("all_reduce", s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllReduce(send, recv, count, NcclType(dtype), op == ReduceOp::kAvg ? ncclAvg : ncclSum, c, cs);
    });
  }
  Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& s) override {
    if (root < 0 || root >= size_) {
      return FailOn(s, absl::InvalidArgumentError(absl::StrCat(Label("broadcast"), ": root ", root,
                                                               " is outside the world of ", size_, " ranks")));
    }
    Count(Collective::kBroadcast, count, dtype);
    return Run("broadcast", s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclBroadcast(buf, buf, count, NcclType(dtype), root, c, cs);
    });
  }
  // A one-element all-reduce (NCCL discards empty collectives, so a zero count would order nothing).
  Work Barrier(device::Stream& s) override {
    float* element = handle_->barrier_element();
    if (element == nullptr) {
      return Work(std::make_shared<NcclDone>(absl::ResourceExhaustedError(
          absl::StrCat("barrier on '", options_.name, "': cudaMalloc of its 4-byte buffer failed"))));
    }
    Count(Collective::kBarrier, 0, DType::kF32);
    return Run("barrier", s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllReduce(element, element, 1, ncclFloat32, ncclSum, c, cs);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    if (handle_->aborted()) return absl::AbortedError(absl::StrCat("Dup('", name, "') of an aborted communicator"));
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    const std::string what =
        absl::StrCat("Dup('", name, "') of '", options_.name, "' (rank ", rank_, ", ncclCommSplit)");
    // Issue aborts the parent when the split does not settle, which ends its job: the slot is then final.
    STRATA_ASSIGN_OR_RETURN(
        ncclComm_t c, SplitNccl(0, rank_, [&](auto&& call) { return handle_->Issue(call, what, o.timeout_ms); },
                            /*aborts_parent=*/true, what, o.timeout_ms));
    return std::unique_ptr<Communicator>(new NcclCommunicator(c, rank_, size_, std::move(o)));
  }

  // ncclCommSplit with the caller's color; the child's rank and size are asked of NCCL. A negative
  // color would be NCCL_SPLIT_NOCOLOR (no communicator for this rank), which the contract refuses.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override {
    if (color < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Split('", name, "') of '", options_.name, "': color ", color,
                                                     " on rank ", rank_, "; colors must be >= 0"));
    }
    if (handle_->aborted()) return absl::AbortedError(absl::StrCat("Split('", name, "') of an aborted communicator"));
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    const std::string what = absl::StrCat("Split('", name, "') of '", options_.name, "' (rank ", rank_, ", color ",
                                          color, ", ncclCommSplit)");
    STRATA_ASSIGN_OR_RETURN(
        ncclComm_t c, SplitNccl(color, key, [&](auto&& call) { return handle_->Issue(call, what, o.timeout_ms); },
                                  /*aborts_parent=*/true, what, o.timeout_ms));
    int rank = 0, size = 0;
    absl::Status asked = STRATA_NCCL_CALL(ncclCommUserRank(c, &rank));
    if (asked.ok()) asked = STRATA_NCCL_CALL(ncclCommCount(c, &size));
    if (!asked.ok()) {
      ncclCommAbort(c);
      return asked;
    }
    return std::unique_ptr<Communicator>(new NcclCommunicator(c, rank, size, std::move(o)));
  }

  Traffic traffic() const override { return traffic_.Read(); }

  void Abort(const absl::Status& cause) override { handle_->Abort(); }

 private:
  // A collective that fails before it reaches the device: the failure is sticky on `s` at once (later
  // collectives issued on it return it, as on the host back-ends) and the Work carries it.
  Work FailOn(device::Stream& s, absl::Status failure) {
    if (auto* cuda = dynamic_cast<device::CudaStream*>(&s)) cuda->Fail(failure);
    return Work(std::make_shared<NcclDone>(std::move(failure)));
  }

  void Count(Collective c, size_t count, DType dtype) { traffic_.Add(c, PayloadBytes(c, count, dtype, size_)); }

  // "all_gather #12 on 'gather' (rank 3)": the collective's name in errors; numbers it.
  std::string Label(const char* what) {
    return absl::StrCat(what, " #", seq_++, " on '", options_.name, "' (rank ", rank_, ")");
  }

  template <typename F>
  Work Run(const char* what, device::Stream& s, F&& call) {
    const std::string label = Label(what);
    if (handle_->aborted()) {
      return Work(
          std::make_shared<NcclDone>(absl::AbortedError(absl::StrCat(label, ": the communicator was aborted"))));
    }
    auto* cuda = dynamic_cast<device::CudaStream*>(&s);
    if (cuda == nullptr) {
      return Work(std::make_shared<NcclDone>(absl::InvalidArgumentError(
          absl::StrCat(label, ": the NCCL back-end needs a CUDA stream, got '", s.name(), "'"))));
    }
    // An earlier failure on this stream is sticky: nothing after it is issued.
    if (absl::Status earlier = cuda->status(); !earlier.ok()) return Work(std::make_shared<NcclDone>(earlier));
    cudaStream_t cs = cuda->native();
    absl::Status st = handle_->Issue([&](ncclComm_t c) { return call(c, cs); }, label, options_.timeout_ms);
    if (!st.ok()) return FailOn(s, st);
    auto event = device::CudaEvent::Create();
    if (!event.ok()) return FailOn(s, Annotate(event.status(), label));
    cuda->Record(**event);
    return Work(std::make_shared<NcclDone>(std::move(*event), handle_, label, options_.timeout_ms));
  }

  std::shared_ptr<NcclHandle> handle_;
  const int rank_, size_;
  const Options options_;
  uint64_t seq_ = 0;
  TrafficCounter traffic_;  // Note [Traffic]
};

// The event of an operation that already finished (host-buffer collectives run to completion).
class Finished final : public device::Event {
 public:
  explicit Finished(absl::Status s) : status_(std::move(s)) {}
  absl::Status Synchronize() override { return status_; }
  bool Query() override { return true; }
  int64_t completed_ns() const override { return 0; }

 private:
  absl::Status status_;
};

// Note [Host buffers over NCCL] (header).
class HostOverNccl final : public Communicator {
 public:
  HostOverNccl(std::unique_ptr<Communicator> nccl, std::unique_ptr<device::CudaStream> stream)
      : nccl_(std::move(nccl)), stream_(std::move(stream)) {}
  ~HostOverNccl() override { cudaFree(bounce_); }

  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  const Options& options() const override { return nccl_->options(); }

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream&) override {
    const size_t in = count * DTypeBytes(dtype);
    return Bounced(send, in, recv, in * size(), [&](char* d_in, char* d_out) {
      return nccl_->AllGather(d_in, d_out, count, dtype, *stream_);
    });
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, device::Stream&) override {
    const size_t out = count * DTypeBytes(dtype);
    return Bounced(send, out * size(), recv, out, [&](char* d_in, char* d_out) {
      return nccl_->ReduceScatter(d_in, d_out, count, dtype, op, *stream_);
    });
  }
  Work AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, device::Stream&) override {
    const size_t bytes = count * DTypeBytes(dtype);
    return Bounced(send, bytes, recv, bytes, [&](char* d_in, char* d_out) {
      return nccl_->AllReduce(d_in, d_out, count, dtype, op, *stream_);
    });
  }
  Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream&) override {
    const size_t bytes = count * DTypeBytes(dtype);
    return Bounced(buf, bytes, buf, bytes, [&](char* d_in, char*) {
      return nccl_->Broadcast(d_in, count, dtype, root, *stream_);
    }, /*in_place=*/true);
  }
  Work Barrier(device::Stream&) override {
    return Work(std::make_shared<Finished>(nccl_->Barrier(*stream_).Wait()));
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> dup, nccl_->Dup(name, timeout_ms));
    return HostBuffersOverNccl(std::move(dup));
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part, nccl_->Split(color, key, name, timeout_ms));
    return HostBuffersOverNccl(std::move(part));
  }
  Traffic traffic() const override { return nccl_->traffic(); }  // the bounced collectives are its own
  void Abort(const absl::Status& cause) override { nccl_->Abort(cause); }

 private:
  // Copies `in` host bytes to the device, runs `op` (input, output: device pointers), copies `out` bytes
  // back. In place: the output is the input.
  template <typename Op>
  Work Bounced(const void* host_in, size_t in, void* host_out, size_t out, Op&& op, bool in_place = false) {
    auto run = [&]() -> absl::Status {
      const size_t need = in_place ? in : in + out;
      if (need > capacity_) {
        cudaFree(bounce_);
        bounce_ = nullptr;
        capacity_ = 0;
        STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMalloc(&bounce_, need)));
        capacity_ = need;
      }
      char* d_in = static_cast<char*>(bounce_);
      char* d_out = in_place ? d_in : d_in + in;
      cudaStream_t cs = stream_->native();
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemcpyAsync(d_in, host_in, in, cudaMemcpyHostToDevice, cs)));
      STRATA_RETURN_IF_ERROR(op(d_in, d_out).Wait());
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemcpyAsync(host_out, d_out, out, cudaMemcpyDeviceToHost, cs)));
      return STRATA_CUDA_CALL(cudaStreamSynchronize(cs));
    };
    return Work(std::make_shared<Finished>(run()));
  }

  std::unique_ptr<Communicator> nccl_;
  std::unique_ptr<device::CudaStream> stream_;
  void* bounce_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> HostBuffersOverNccl(std::unique_ptr<Communicator> nccl) {
  if (nccl == nullptr || !nccl->device_buffers()) {
    return absl::InvalidArgumentError("HostBuffersOverNccl needs an NCCL communicator");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::CudaStream> stream, device::CudaStream::Create("host-over-nccl"));
  return std::unique_ptr<Communicator>(new HostOverNccl(std::move(nccl), std::move(stream)));
}

absl::StatusOr<std::unique_ptr<Communicator>> AdoptNcclCommunicator(void* nccl_comm, const Options& options) {
  if (nccl_comm == nullptr) return absl::InvalidArgumentError("the ncclComm_t is null");
  ncclComm_t theirs = static_cast<ncclComm_t>(nccl_comm);
  int size = 0, rank = 0;
  STRATA_RETURN_IF_ERROR(STRATA_NCCL_CALL(ncclCommCount(theirs, &size)));
  STRATA_RETURN_IF_ERROR(STRATA_NCCL_CALL(ncclCommUserRank(theirs, &rank)));
  // Ours is nonblocking (Note [Nonblocking NCCL]). Whether the split itself is bounded by the deadline is
  // the caller's communicator's choice: NCCL takes it from the parent, and a blocking parent blocks here.
  // The caller's communicator is theirs: a split that does not settle leaves it as it is (SplitNccl).
  const std::string what = absl::StrCat("adopting the caller's NCCL communicator (rank ", rank, " of ", size,
                                        ", ncclCommSplit)");
  STRATA_ASSIGN_OR_RETURN(
      ncclComm_t ours,
      SplitNccl(0, rank, [&](auto&& call) { return Settle(theirs, call(theirs), what, options.timeout_ms); },
                /*aborts_parent=*/false, what, options.timeout_ms));
  return std::unique_ptr<Communicator>(new NcclCommunicator(ours, rank, size, options));
}

absl::StatusOr<std::string> NewNcclId() {
  ncclUniqueId id;
  STRATA_RETURN_IF_ERROR(STRATA_NCCL_CALL(ncclGetUniqueId(&id)));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const std::string& id, int rank, int world_size,
                                                                     const Options& options) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("an NCCL id has ", sizeof(uid.internal), " bytes, got ", id.size()));
  }
  std::memcpy(uid.internal, id.data(), id.size());
  ncclConfig_t config = NonblockingConfig();  // Note [Nonblocking NCCL]: a rank that never joins is a deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t issued = ncclCommInitRankConfig(&comm, world_size, uid, rank, &config);
  STRATA_RETURN_IF_ERROR(SettleNew(
      comm, issued,
      absl::StrCat("NCCL initialisation of rank ", rank, " of ", world_size,
                   " (every rank must start, pass the same id and reach rank 0's address; NCCL_SOCKET_IFNAME "
                   "picks the interface)"),
      options.timeout_ms));
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, world_size, options));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromHost(Communicator& host, device::Stream& host_stream,
                                                                 const Options& options) {
  std::string id(sizeof(ncclUniqueId::internal), '\0');
  if (host.rank() == 0) {
    STRATA_ASSIGN_OR_RETURN(id, NewNcclId());
  }
  STRATA_RETURN_IF_ERROR(BroadcastBytes(host, id.data(), id.size(), 0, host_stream).Wait());
  return CreateNcclCommunicator(id, host.rank(), host.size(), options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromTorchrun(const TorchrunEnv& env, const Options& options) {
  // Each rank's own verdict goes into the exchange (Note [Bootstrap over the store]): a rank without a GPU, or
  // a rank 0 without an id, fails every rank at once, each naming it, instead of leaving the others in NCCL's
  // initialisation until the deadline.
  absl::Status local = absl::OkStatus();
  std::string id;
  if (device::CudaDeviceCount() == 0) {
    local = absl::FailedPreconditionError(absl::StrCat("torchrun LOCAL_RANK ", env.local_rank,
                                                       ": no CUDA GPU is visible (check nvidia-smi and "
                                                       "CUDA_VISIBLE_DEVICES); NCCL needs one per rank"));
  } else if (env.rank == 0) {
    absl::StatusOr<std::string> made = NewNcclId();
    if (made.ok()) {
      id = *std::move(made);
    } else {
      local = made.status();
    }
  }
  STRATA_ASSIGN_OR_RETURN(id, ExchangeBlob(env, "nccl", id, options.timeout_ms, local));
  return CreateNcclCommunicator(id, env.rank, env.world_size, options);
}

}  // namespace strata::comm
