#include "runtime/comm/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace strata::comm {
namespace {

constexpr uint32_t kMagic = 0x53545241;  // "STRA"
using Clock = std::chrono::steady_clock;

absl::StatusOr<int> IntVar(const char* name, const std::optional<std::string>& v, int lo, int hi) {
  int out = 0;
  if (!v) return absl::InvalidArgumentError(absl::StrCat("torchrun-style launch: ", name, " is not set"));
  if (!absl::SimpleAtoi(*v, &out) || out < lo || out > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("torchrun-style launch: ", name, "='", *v, "' is not an integer in [", lo, ", ", hi, "]"));
  }
  return out;
}

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  int get() const { return fd_; }

 private:
  int fd_;
};

int RemainingMs(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

// Sends or receives exactly n bytes before the deadline.
absl::Status Transfer(int fd, void* buf, size_t n, bool send, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&pfd, 1, RemainingMs(deadline));
    if (ready == 0) return absl::DeadlineExceededError(absl::StrCat("bootstrap: timed out ", what));
    if (ready < 0) return ErrnoError("poll", errno, __FILE__, __LINE__);
    const ssize_t k = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k == 0) return absl::UnavailableError(absl::StrCat("bootstrap: peer closed the connection ", what));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Annotate(ErrnoError(send ? "send" : "recv", errno, __FILE__, __LINE__), what);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_in> Resolve(const TorchrunEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap: cannot resolve MASTER_ADDR '", env.master_addr, "': ", ::gai_strerror(rc)));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(env.exchange_port));
  return addr;
}

std::string Where(const TorchrunEnv& env) { return absl::StrCat(env.master_addr, ":", env.exchange_port); }

absl::StatusOr<std::string> Serve(const TorchrunEnv& env, const sockaddr_in& addr, const std::string& blob,
                                  Clock::time_point deadline) {
  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return ErrnoError("socket", errno, __FILE__, __LINE__);
  const int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    return Annotate(ErrnoError("bind", err, __FILE__, __LINE__),
                    absl::StrCat("bootstrap on ", Where(env),
                                 err == EADDRINUSE ? " (the port is taken: choose another with STRATA_BOOTSTRAP_PORT, "
                                                     "the same on every rank)"
                                                   : ""));
  }
  if (::listen(listener.get(), env.world_size) != 0) return ErrnoError("listen", errno, __FILE__, __LINE__);
  std::vector<Socket> peers;
  std::set<int> seen;
  while (static_cast<int>(seen.size()) < env.world_size - 1) {
    pollfd pfd{listener.get(), POLLIN, 0};
    if (::poll(&pfd, 1, RemainingMs(deadline)) <= 0) {
      std::vector<int> missing;
      for (int r = 1; r < env.world_size; ++r) {
        if (!seen.count(r)) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat("bootstrap: rank 0 on ", Where(env), " waited for rank(s) ",
                                                      absl::StrJoin(missing, ","), " until the deadline"));
    }
    Socket peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.get() < 0) continue;
    uint32_t hello[3];
    STRATA_RETURN_IF_ERROR(Transfer(peer.get(), hello, sizeof(hello), false, deadline, "reading a hello"));
    const int r = static_cast<int>(hello[1]);
    if (hello[0] != kMagic || static_cast<int>(hello[2]) != env.world_size || r < 1 || r >= env.world_size ||
        !seen.insert(r).second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bootstrap: a peer announced rank ", r, " of world size ", hello[2], " (this job: world size ",
          env.world_size, "; ranks 1..", env.world_size - 1, " once each)", hello[0] != kMagic ? "; bad magic" : ""));
    }
    peers.push_back(std::move(peer));
  }
  const uint32_t len = static_cast<uint32_t>(blob.size());
  for (const Socket& p : peers) {
    STRATA_RETURN_IF_ERROR(Transfer(p.get(), const_cast<uint32_t*>(&len), 4, true, deadline, "sending the id"));
    STRATA_RETURN_IF_ERROR(Transfer(p.get(), const_cast<char*>(blob.data()), len, true, deadline, "sending the id"));
  }
  return blob;
}

absl::StatusOr<std::string> Join(const TorchrunEnv& env, const sockaddr_in& addr, Clock::time_point deadline) {
  while (true) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.get() < 0) return ErrnoError("socket", errno, __FILE__, __LINE__);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      uint32_t hello[3] = {kMagic, static_cast<uint32_t>(env.rank), static_cast<uint32_t>(env.world_size)};
      STRATA_RETURN_IF_ERROR(Transfer(s.get(), hello, sizeof(hello), true, deadline, "sending the hello"));
      uint32_t len = 0;
      STRATA_RETURN_IF_ERROR(
          Transfer(s.get(), &len, 4, false, deadline, absl::StrCat("waiting for rank 0 on ", Where(env))));
      std::string blob(len, '\0');
      STRATA_RETURN_IF_ERROR(Transfer(s.get(), blob.data(), len, false, deadline, "receiving the id"));
      return blob;
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("bootstrap: rank ", env.rank, " could not reach rank 0 at ",
                                                      Where(env), " (MASTER_ADDR, and STRATA_BOOTSTRAP_PORT or else "
                                                      "MASTER_PORT + 1) before the deadline"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 may not be listening yet
  }
}

}  // namespace

absl::StatusOr<TorchrunEnv> ParseTorchrunEnv(const env::TorchrunVars& v) {
  if (!v.rank && !v.world_size && !v.master_addr && !v.master_port) {
    return absl::NotFoundError("not a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset)");
  }
  TorchrunEnv e;
  STRATA_ASSIGN_OR_RETURN(e.world_size, IntVar("WORLD_SIZE", v.world_size, 1, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(e.rank, IntVar("RANK", v.rank, 0, e.world_size - 1));
  STRATA_ASSIGN_OR_RETURN(e.local_rank, IntVar("LOCAL_RANK", v.local_rank ? v.local_rank : v.rank, 0, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(e.master_port, IntVar("MASTER_PORT", v.master_port, 1, 65535));
  if (!v.master_addr || v.master_addr->empty()) {
    return absl::InvalidArgumentError("torchrun-style launch: MASTER_ADDR is not set");
  }
  e.master_addr = *v.master_addr;
  if (v.bootstrap_port) {
    STRATA_ASSIGN_OR_RETURN(e.exchange_port, IntVar("STRATA_BOOTSTRAP_PORT", v.bootstrap_port, 1, 65535));
  } else if (e.master_port == 65535) {
    return absl::InvalidArgumentError("torchrun-style launch: MASTER_PORT=65535 leaves no port above it for "
                                      "Strata's id exchange; set STRATA_BOOTSTRAP_PORT");
  } else {
    e.exchange_port = e.master_port + 1;
  }
  return e;
}

absl::StatusOr<TorchrunEnv> TorchrunLaunch() {
  const env::TorchrunVars vars = env::Torchrun();
  if (env::MpiLauncherWorldSize() || !vars.world_size) {
    return absl::NotFoundError("not a torchrun launch (WORLD_SIZE unset, or started by an MPI launcher)");
  }
  return ParseTorchrunEnv(vars);
}

absl::StatusOr<std::string> ExchangeBlob(const TorchrunEnv& env, const std::string& blob, int64_t timeout_ms) {
  if (env.world_size == 1) return blob;
  STRATA_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(env));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  return env.rank == 0 ? Serve(env, addr, blob, deadline) : Join(env, addr, deadline);
}

}  // namespace strata::comm
