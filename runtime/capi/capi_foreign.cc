// strata_comm_create_foreign: the trainer's callbacks (strata_foreign_comm) as a comm::ForeignEndpoint, under
// the foreign communicator of runtime/comm/foreign_communicator.h (docs/decisions/0033-foreign-communicators.md).
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/comm/foreign_communicator.h"

namespace strata::capi {

// The layout of ABI version 1, the smallest one a caller may pass.
constexpr size_t kForeignV1Size = sizeof(strata_foreign_comm);

namespace {
constexpr size_t kErrorBytes = 1024;
constexpr size_t kValueBytes = 4096;  // the store's values Strata reads (notices, answers) are shorter

absl::StatusCode CodeOfStatus(strata_status s) {
  switch (s) {
    case STRATA_ERR_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case STRATA_ERR_FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    case STRATA_ERR_OUT_OF_RANGE:
      return absl::StatusCode::kOutOfRange;
    case STRATA_ERR_RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case STRATA_ERR_DEADLINE_EXCEEDED:
      return absl::StatusCode::kDeadlineExceeded;
    case STRATA_ERR_UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case STRATA_ERR_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case STRATA_ERR_ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    case STRATA_ERR_PEER_FAILED:
      return absl::StatusCode::kAborted;  // the trainer's word: no notice payload
    default:
      return absl::StatusCode::kInternal;
  }
}

// Copies and checks a trainer's strata_foreign_comm (strata.h, "Versioned structs").
absl::Status ReadForeign(const strata_foreign_comm* in, const char* what, strata_foreign_comm* out) {
  *out = STRATA_FOREIGN_COMM_INIT;
  STRATA_RETURN_IF_ERROR(ReadVersioned(in, kForeignV1Size, what, out));
  const char* missing = out->all_gather == nullptr       ? "all_gather"
                        : out->reduce_scatter == nullptr ? "reduce_scatter"
                        : out->all_reduce == nullptr     ? "all_reduce"
                        : out->broadcast == nullptr      ? "broadcast"
                        : out->barrier == nullptr        ? "barrier"
                        : out->dup == nullptr            ? "dup"
                        : out->split == nullptr          ? "split"
                                                         : nullptr;
  if (missing != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has no ", missing,
                                                   " callback (NULL); only destroy, "
                                                   "kv_set, kv_get and abort are optional"));
  }
  if ((out->kv_set == nullptr) != (out->kv_get == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " sets one of kv_set and kv_get: the store needs both, or neither"));
  }
  if (out->size < 1 || out->rank < 0 || out->rank >= out->size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " says rank ", out->rank, " of size ", out->size, "; a rank is in [0, size), size >= 1"));
  }
  return absl::OkStatus();
}

// One rank's strata_foreign_comm. Owns `user` (destroy runs in the destructor).
class CallbackEndpoint final : public comm::ForeignEndpoint {
 public:
  explicit CallbackEndpoint(const strata_foreign_comm& c) : c_(c) {}
  ~CallbackEndpoint() override {
    if (c_.destroy != nullptr) c_.destroy(c_.user);
  }

  int rank() const override { return c_.rank; }
  int size() const override { return c_.size; }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Invoke("all_gather",
                  [&](char* e, size_t n) { return c_.all_gather(c_.user, send, recv, count, ToCDType(dtype), e, n); });
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Invoke("reduce_scatter", [&](char* e, size_t n) {
      return c_.reduce_scatter(c_.user, send, recv, count, ToCDType(dtype), e, n);
    });
  }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DType dtype) override {
    return Invoke("all_reduce",
                  [&](char* e, size_t n) { return c_.all_reduce(c_.user, send, recv, count, ToCDType(dtype), e, n); });
  }
  absl::Status Broadcast(void* buf, size_t count, DType dtype, int root) override {
    return Invoke("broadcast",
                  [&](char* e, size_t n) { return c_.broadcast(c_.user, buf, count, ToCDType(dtype), root, e, n); });
  }
  absl::Status Barrier() override {
    return Invoke("barrier", [&](char* e, size_t n) { return c_.barrier(c_.user, e, n); });
  }

  absl::StatusOr<std::unique_ptr<comm::ForeignEndpoint>> Dup(int64_t timeout_ms) override {
    strata_foreign_comm out = STRATA_FOREIGN_COMM_INIT;
    STRATA_RETURN_IF_ERROR(Invoke("dup", [&](char* e, size_t n) { return c_.dup(c_.user, timeout_ms, &out, e, n); }));
    return Adopt(out, "the strata_foreign_comm made by dup");
  }

  absl::StatusOr<std::unique_ptr<comm::ForeignEndpoint>> Split(const std::vector<int>& colors,
                                                               const std::vector<int>& keys,
                                                               int64_t timeout_ms) override {
    const std::vector<int32_t> c(colors.begin(), colors.end()), k(keys.begin(), keys.end());
    strata_foreign_comm out = STRATA_FOREIGN_COMM_INIT;
    STRATA_RETURN_IF_ERROR(Invoke(
        "split", [&](char* e, size_t n) { return c_.split(c_.user, c.data(), k.data(), timeout_ms, &out, e, n); }));
    return Adopt(out, "the strata_foreign_comm made by split");
  }

  bool has_store() const override { return c_.kv_get != nullptr; }

  absl::Status StoreSet(const std::string& key, const std::string& value) override {
    if (!has_store()) return comm::ForeignEndpoint::StoreSet(key, value);
    return Invoke("kv_set",
                  [&](char* e, size_t n) { return c_.kv_set(c_.user, key.c_str(), value.data(), value.size(), e, n); });
  }

  absl::StatusOr<std::optional<std::string>> StoreGet(const std::string& key) override {
    if (!has_store()) return comm::ForeignEndpoint::StoreGet(key);
    std::string value(kValueBytes, '\0');
    int64_t length = -1;
    STRATA_RETURN_IF_ERROR(Invoke("kv_get", [&](char* e, size_t n) {
      return c_.kv_get(c_.user, key.c_str(), value.data(), value.size(), &length, e, n);
    }));
    if (length < 0) return std::optional<std::string>();
    value.resize(std::min<size_t>(static_cast<size_t>(length), kValueBytes));
    return std::optional<std::string>(std::move(value));
  }

  void AbortJob(const std::string& reason) override {
    if (c_.abort != nullptr) c_.abort(c_.user, reason.c_str());
  }

  // A callback's new communicator: Strata owns it from here, so one that fails the checks is destroyed.
  static absl::StatusOr<std::unique_ptr<comm::ForeignEndpoint>> Adopt(const strata_foreign_comm& made,
                                                                      const char* what) {
    strata_foreign_comm checked;
    absl::Status s = ReadForeign(&made, what, &checked);
    if (!s.ok()) {
      if (made.destroy != nullptr) made.destroy(made.user);
      return s;
    }
    return std::unique_ptr<comm::ForeignEndpoint>(new CallbackEndpoint(checked));
  }

 private:
  template <typename F>
  static absl::Status Invoke(const char* what, F&& call) {
    char error[kErrorBytes] = {};
    const strata_status s = call(error, sizeof(error));
    if (s == STRATA_OK) return absl::OkStatus();
    error[sizeof(error) - 1] = '\0';
    return absl::Status(CodeOfStatus(s), absl::StrCat("the ", what, " callback returned ", strata_status_name(s), ": ",
                                                      error[0] != '\0' ? error : "(no message)"));
  }

  const strata_foreign_comm c_;
};

}  // namespace
}  // namespace strata::capi

using strata::capi::Call;
using strata::capi::NullArgument;

extern "C" {

strata_status strata_comm_create_foreign(const strata_foreign_comm* foreign, int64_t timeout_ms, strata_comm** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (out != nullptr) *out = nullptr;
    if (foreign == nullptr) return NullArgument("foreign");
    // Strata owns foreign->user from here (strata.h): destroyed on every failure before the communicator exists.
    strata_foreign_comm checked;
    if (absl::Status s = strata::capi::ReadForeign(foreign, "foreign", &checked); !s.ok() || out == nullptr) {
      // A header this library cannot read is no strata_foreign_comm: its destroy is not called (strata.h).
      const bool readable = foreign->version != 0 && foreign->struct_size >= strata::capi::kForeignV1Size;
      if (readable && foreign->destroy != nullptr) foreign->destroy(foreign->user);
      return s.ok() ? NullArgument("out") : s;
    }
    strata::comm::Options o;
    o.name = "world";
    o.timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
    auto c = std::make_unique<strata_comm>();
    STRATA_ASSIGN_OR_RETURN(
        c->comm, strata::comm::CreateForeignCommunicator(std::make_unique<strata::capi::CallbackEndpoint>(checked), o));
    *out = c.release();
    return absl::OkStatus();
  });
}

}  // extern "C"
