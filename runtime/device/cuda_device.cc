#include "runtime/device/cuda_device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::device {

absl::Status CudaError(const char* call, cudaError_t err, const char* file, int line) {
  const std::string msg = absl::StrCat(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(err), ": ",
                                       cudaGetErrorString(err));
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// ---- CudaEvent ----

absl::StatusOr<std::unique_ptr<CudaEvent>> CudaEvent::Create() {
  cudaEvent_t e;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
  return std::unique_ptr<CudaEvent>(new CudaEvent(e));
}

CudaEvent::~CudaEvent() { cudaEventDestroy(event_); }

absl::Status CudaEvent::Synchronize() { return STRATA_CUDA_CALL(cudaEventSynchronize(event_)); }

// Done, or failed (Synchronize then says how): only cudaErrorNotReady means still pending, so a sticky
// device error is reported at once instead of being polled until a deadline.
bool CudaEvent::Query() { return cudaEventQuery(event_) != cudaErrorNotReady; }

// ---- CudaStream ----

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(std::string name) {
  cudaStream_t s;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  return std::unique_ptr<CudaStream>(new CudaStream(std::move(name), s));
}

CudaStream::~CudaStream() {
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void CudaStream::Fail(absl::Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = std::move(s);
}

namespace {
struct HostCall {
  HostTask task;
  CudaStream* stream;
  std::mutex* mu;
  absl::Status* status;
};
}  // namespace

void CudaStream::Enqueue(HostTask task) {
  auto* call = new HostCall{std::move(task), this, &mu_, &status_};
  const cudaError_t err = cudaLaunchHostFunc(
      stream_,
      [](void* p) {
        std::unique_ptr<HostCall> c(static_cast<HostCall*>(p));
        {
          std::lock_guard<std::mutex> lock(*c->mu);
          if (!c->status->ok()) return;  // sticky: later tasks are skipped
        }
        absl::Status s = c->task();
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(*c->mu);
          if (c->status->ok()) *c->status = std::move(s);
        }
      },
      call);
  if (err != cudaSuccess) {
    delete call;
    Fail(CudaError("cudaLaunchHostFunc", err, __FILE__, __LINE__));
  }
}

void CudaStream::Record(Event& event) {
  absl::Status s = STRATA_CUDA_CALL(cudaEventRecord(static_cast<CudaEvent&>(event).native(), stream_));
  if (!s.ok()) Fail(std::move(s));
}

void CudaStream::WaitFor(Event& event) {
  auto* cuda = dynamic_cast<CudaEvent*>(&event.waitable());
  if (cuda == nullptr) {
    // Nothing on the device to wait for: an operation that failed before it got there (its status
    // becomes this stream's), or a host-side event, which the device cannot wait for.
    absl::Status s = event.Query()
                         ? event.Synchronize()
                         : absl::InvalidArgumentError(absl::StrCat(
                               "CUDA stream '", name_, "' cannot wait on the device for a pending host event"));
    if (!s.ok()) Fail(std::move(s));
    return;
  }
  absl::Status s = STRATA_CUDA_CALL(cudaStreamWaitEvent(stream_, cuda->native(), 0));
  if (!s.ok()) Fail(std::move(s));
}

absl::Status CudaStream::Synchronize() {
  absl::Status s = STRATA_CUDA_CALL(cudaStreamSynchronize(stream_));
  if (!s.ok()) Fail(s);
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

absl::Status CudaStream::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

// ---- CudaDevice ----

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  const int n = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= n) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", ordinal, " requested but ", n, " visible"));
  }
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaSetDevice(ordinal)));
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal));
}

absl::StatusOr<std::unique_ptr<Stream>> CudaDevice::CreateStream(absl::string_view name) {
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaSetDevice(ordinal_)));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> s, CudaStream::Create(std::string(name)));
  return std::unique_ptr<Stream>(std::move(s));
}

std::unique_ptr<Event> CudaDevice::CreateEvent() {
  auto e = CudaEvent::Create();
  return e.ok() ? std::unique_ptr<Event>(std::move(*e)) : nullptr;
}

}  // namespace strata::device
