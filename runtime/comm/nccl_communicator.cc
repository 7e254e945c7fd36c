#include "runtime/comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
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

// Completion of one collective: polls the CUDA event and the communicator's asynchronous error against
// the deadline; aborts the communicator on a timeout or an error (Note: NCCL cannot say which peer).
class NcclDone final : public device::Event {
 public:
  NcclDone(std::unique_ptr<device::CudaEvent> e, ncclComm_t comm, std::string what, int64_t timeout_ms)
      : event_(std::move(e)), comm_(comm), what_(std::move(what)), timeout_ms_(timeout_ms) {}
  explicit NcclDone(absl::Status failed) : failed_(std::move(failed)) {}

  absl::Status Synchronize() override {
    if (!failed_.ok()) return failed_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (!event_->Query()) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        failed_ = async != ncclSuccess
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

 private:
  std::unique_ptr<device::CudaEvent> event_;
  ncclComm_t comm_ = nullptr;
  std::string what_;
  int64_t timeout_ms_ = 0;
  absl::Status failed_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, Options o)
      : comm_(comm), rank_(rank), size_(size), options_(std::move(o)) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Options& options() const override { return options_; }

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& s) override {
    return Run("all_gather", s, [&](cudaStream_t cs) {
      return ncclAllGather(send, recv, count, NcclType(dtype), comm_, cs);
    });
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     device::Stream& s) override {
    return Run("reduce_scatter", s, [&](cudaStream_t cs) {
      return ncclReduceScatter(send, recv, count, NcclType(dtype), op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, cs);
    });
  }
  Work AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, device::Stream& s) override {
    return Run("all_reduce", s, [&](cudaStream_t cs) {
      return ncclAllReduce(send, recv, count, NcclType(dtype), op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, cs);
    });
  }
  Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& s) override {
    return Run("broadcast", s, [&](cudaStream_t cs) {
      return ncclBroadcast(buf, buf, count, NcclType(dtype), root, comm_, cs);
    });
  }
  Work Barrier(device::Stream& s) override {  // an empty all-reduce orders every rank
    return Run("barrier", s, [&](cudaStream_t cs) {
      return ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm_, cs);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    ncclComm_t c = nullptr;
    STRATA_RETURN_IF_ERROR(STRATA_NCCL_CALL(ncclCommSplit(comm_, 0, rank_, &c, nullptr)));
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<Communicator>(new NcclCommunicator(c, rank_, size_, std::move(o)));
  }

  void Abort(const absl::Status& cause) override { ncclCommAbort(comm_); }

 private:
  template <typename F>
  Work Run(const char* what, device::Stream& s, F&& call) {
    const std::string label = absl::StrCat(what, " #", seq_++, " on '", options_.name, "' (rank ", rank_, ")");
    auto* cuda = dynamic_cast<device::CudaStream*>(&s);
    if (cuda == nullptr) {
      return Work(std::make_shared<NcclDone>(absl::InvalidArgumentError(
          absl::StrCat(label, ": the NCCL back-end needs a CUDA stream, got '", s.name(), "'"))));
    }
    absl::Status st = STRATA_NCCL_CALL(call(cuda->native()));
    auto event = device::CudaEvent::Create();
    if (!st.ok() || !event.ok()) {
      return Work(std::make_shared<NcclDone>(Annotate(st.ok() ? event.status() : st, label)));
    }
    cuda->Record(**event);
    return Work(std::make_shared<NcclDone>(std::move(*event), comm_, label, options_.timeout_ms));
  }

  ncclComm_t comm_;
  const int rank_, size_;
  const Options options_;
  uint64_t seq_ = 0;
};

}  // namespace

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
  ncclComm_t comm = nullptr;
  STRATA_RETURN_IF_ERROR(STRATA_NCCL_CALL(ncclCommInitRank(&comm, world_size, uid, rank)));
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, world_size, options));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclFromHost(Communicator& host, device::Stream& host_stream,
                                                                 const Options& options) {
  std::string id(sizeof(ncclUniqueId::internal), '\0');
  if (host.rank() == 0) {
    STRATA_ASSIGN_OR_RETURN(id, NewNcclId());
  }
  STRATA_RETURN_IF_ERROR(host.Broadcast(id.data(), id.size() / 2, DType::kF16, 0, host_stream).Wait());
  return CreateNcclCommunicator(id, host.rank(), host.size(), options);
}

}  // namespace strata::comm
