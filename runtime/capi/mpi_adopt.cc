// An MPI communicator over a duplicate of a host-owned MPI communicator (see mpi_adopt.h).
#include "runtime/capi/mpi_adopt.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/mpi_call.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"

namespace strata::capi {
namespace {

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

void Bf16SumOp(void* in, void* inout, int* len, MPI_Datatype*) {
  comm::AccumulateInto(inout, in, static_cast<size_t>(*len), DType::kBF16);
}
void Fp16SumOp(void* in, void* inout, int* len, MPI_Datatype*) {
  comm::AccumulateInto(inout, in, static_cast<size_t>(*len), DType::kF16);
}

// The custom reduction ops, shared by an adopted communicator and its duplicates.
struct AdoptedContext {
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op fp16_sum = MPI_OP_NULL;
  ~AdoptedContext() {
    if (Finalized()) return;  // the host finalised MPI first: its objects are gone with it
    if (bf16_sum != MPI_OP_NULL) MPI_Op_free(&bf16_sum);
    if (fp16_sum != MPI_OP_NULL) MPI_Op_free(&fp16_sum);
  }
};

MPI_Datatype MpiType(DType t) { return t == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

class AdoptedMpiCommunicator final : public comm::HostCommunicator {
 public:
  AdoptedMpiCommunicator(std::shared_ptr<AdoptedContext> ctx, MPI_Comm comm, comm::Options options)
      : ctx_(std::move(ctx)), comm_(comm), options_(std::move(options)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~AdoptedMpiCommunicator() override {
    if (!Finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const comm::Options& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    MPI_Comm dup = MPI_COMM_NULL;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(comm_, &dup)));
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN)));
    comm::Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<comm::Communicator>(new AdoptedMpiCommunicator(ctx_, dup, std::move(o)));
  }

  void Abort(const absl::Status& cause) override {
    STRATA_LOG(Error) << "aborting the job: " << cause.message();
    MPI_Abort(comm_, 1);
  }

 protected:
  absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) override {
    STRATA_RETURN_IF_ERROR(CheckCount(count, "all_gather"));
    const bool in_place = send == static_cast<const char*>(recv) + rank_ * count * DTypeBytes(dtype);
    const int n = static_cast<int>(count);
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MpiType(dtype), recv, n,
                                                          MpiType(dtype), comm_, &req)));
    return WaitWithDeadline(req, "all_gather", seq);
  }

  absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, comm::ReduceOp op,
                                uint64_t seq) override {
    STRATA_RETURN_IF_ERROR(CheckCount(count, "reduce_scatter"));
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count),
                                                                     MpiType(dtype), SumOp(dtype), comm_, &req)));
    STRATA_RETURN_IF_ERROR(WaitWithDeadline(req, "reduce_scatter", seq));
    if (op == comm::ReduceOp::kAvg) comm::ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return absl::OkStatus();
  }

  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, comm::ReduceOp op,
                            uint64_t seq) override {
    STRATA_RETURN_IF_ERROR(CheckCount(count, "all_reduce"));
    MPI_Request req;
    STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv,
                                                          static_cast<int>(count), MpiType(dtype), SumOp(dtype),
                                                          comm_, &req)));
    STRATA_RETURN_IF_ERROR(WaitWithDeadline(req, "all_reduce", seq));
    if (op == comm::ReduceOp::kAvg) comm::ScaleInPlace(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return absl::OkStatus();
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

  static absl::Status CheckCount(size_t count, const char* what) {
    if (count <= static_cast<size_t>(INT_MAX)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " of ", count, " elements exceeds MPI's int count"));
  }

  // Polls `req` until it completes or the deadline passes: a short spin, then a growing back-off so an
  // idle wait does not hold a core.
  absl::Status WaitWithDeadline(MPI_Request& req, const char* what, uint64_t seq) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    int64_t sleep_us = 0;
    for (int iter = 0;; ++iter) {
      int flag = 0;
      STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Test(&req, &flag, MPI_STATUS_IGNORE)));
      if (flag) return absl::OkStatus();
      if (std::chrono::steady_clock::now() > deadline) break;
      if (iter > 200) {
        sleep_us = std::min<int64_t>(sleep_us + 5, 200);
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        what, " #", seq, " on '", options_.name, "' (rank ", rank_, " of ", size_, ") timed out after ",
        options_.timeout_ms, " ms: a peer is dead, stuck, or issued a different sequence of collectives"));
  }

  std::shared_ptr<AdoptedContext> ctx_;
  MPI_Comm comm_;
  const comm::Options options_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

absl::StatusOr<bool> MpiInitialized() {
  int initialized = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Initialized(&initialized)));
  if (initialized && Finalized()) {
    return absl::FailedPreconditionError("MPI was already finalised in this process; it cannot be used again");
  }
  return initialized != 0;
}

int MpiWorldFortranHandle() { return static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)); }

absl::StatusOr<std::unique_ptr<comm::Communicator>> AdoptMpiComm(int fortran_handle, const comm::Options& options) {
  STRATA_ASSIGN_OR_RETURN(const bool initialized, MpiInitialized());
  if (!initialized) {
    return absl::FailedPreconditionError(
        "MPI is not initialised: initialise it with MPI_THREAD_MULTIPLE first, or use strata_comm_create_mpi_world, "
        "which initialises it");
  }
  int provided = 0;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Query_thread(&provided)));
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI was initialised with thread level ", provided, ", but strata needs MPI_THREAD_MULTIPLE (each stream "
        "issues collectives from its own thread): initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)"));
  }
  const MPI_Comm host = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  if (host == MPI_COMM_NULL) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fortran handle ", fortran_handle, " names MPI_COMM_NULL, not a communicator"));
  }
  auto ctx = std::make_shared<AdoptedContext>();  // frees the ops on every path out
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Op_create(&Bf16SumOp, /*commute=*/1, &ctx->bf16_sum)));
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Op_create(&Fp16SumOp, /*commute=*/1, &ctx->fp16_sum)));
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_dup(host, &dup)));
  auto adopted = std::make_unique<AdoptedMpiCommunicator>(std::move(ctx), dup, options);  // owns `dup` now
  STRATA_RETURN_IF_ERROR(STRATA_MPI_CALL(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN)));
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  SetLogRank(world_rank);
  return std::unique_ptr<comm::Communicator>(std::move(adopted));
}

}  // namespace strata::capi
