// A client of torch.distributed's TCPStore, the key-value store torchrun's agent serves on MASTER_ADDR:MASTER_PORT
// for the whole job (TORCHELASTIC_USE_AGENT_STORE=True). Strata's torchrun bootstrap reads and writes its keys there
// instead of listening on a port of its own (docs/decisions/0039-bootstrap-over-torchruns-store.md).
//
// Note [TCPStore protocol]. The subset used, as torch's own client speaks it (c10d's TCPStore.cpp; checked against
// torch's libuv and legacy servers by tests/python/test_launch.py): a query is one byte of QueryType, then its
// arguments; a string or a byte vector is a uint64 length and the bytes; integers are host order (every rank of a
// torchrun job runs the same build on the same architecture). VALIDATE (0) + uint32 magic 0x3C85F7CE opens the
// connection, with no answer; PING (13) + uint32 nonce is answered by the nonce, which tells a TCPStore from any
// other listener. SET (1) key value: no answer. GET (3) key: the value (the key must exist: asked after CHECK).
// ADD (4) key int64: the new int64 value. CHECK (5) uint64 n, n keys: one byte, 0 when every key exists.
// torch's client puts "/" before every key, so a key written here as "a/b" is torch's `store.get("a/b")`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::comm {

class TcpStoreClient {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects to the store at host:port, retrying a refused connection until `deadline`, then validates and pings
  // it. Errors name the address.
  static absl::StatusOr<TcpStoreClient> Connect(const std::string& host, int port, Clock::time_point deadline);

  TcpStoreClient(TcpStoreClient&& o) noexcept : fd_(o.fd_), where_(std::move(o.where_)) { o.fd_ = -1; }
  TcpStoreClient& operator=(TcpStoreClient&&) = delete;
  ~TcpStoreClient();

  // Each call is one query and its answer, bounded by `deadline`.
  absl::Status Set(const std::string& key, const std::string& value, Clock::time_point deadline);
  absl::StatusOr<bool> Check(const std::string& key, Clock::time_point deadline);
  absl::StatusOr<std::string> Get(const std::string& key, Clock::time_point deadline);  // after Check
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, Clock::time_point deadline);

  const std::string& where() const { return where_; }
  int fd() const { return fd_; }  // the connection's socket (the job watch keeps it open in its child)

 private:
  TcpStoreClient(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  absl::Status Send(const std::string& bytes, Clock::time_point deadline);
  absl::Status Receive(void* out, size_t n, Clock::time_point deadline);
  absl::StatusOr<size_t> Move(char* p, size_t n, bool send, Clock::time_point deadline);

  int fd_ = -1;
  std::string where_;  // "host:port"
};

}  // namespace strata::comm
