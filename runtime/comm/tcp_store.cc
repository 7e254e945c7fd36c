#include "runtime/comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::comm {
namespace {

// Note [TCPStore protocol].
constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kCheck = 5, kPing = 13;
constexpr uint32_t kValidationMagic = 0x3C85F7CE;

int RemainingMs(TcpStoreClient::Clock::time_point deadline) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - TcpStoreClient::Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

template <typename T>
void Append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void AppendBytes(std::string& out, const std::string& bytes) {
  Append<uint64_t>(out, bytes.size());
  out += bytes;
}

// torch's client puts "/" before every key (Note [TCPStore protocol]).
std::string Query(uint8_t type, const std::string& key) {
  std::string q(1, static_cast<char>(type));
  AppendBytes(q, "/" + key);
  return q;
}

}  // namespace

absl::StatusOr<TcpStoreClient> TcpStoreClient::Connect(const std::string& host, int port, Clock::time_point deadline) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  int last_errno = 0;
  while (true) {
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        TcpStoreClient c(fd, where);
        std::string hello(1, static_cast<char>(kValidate));
        Append<uint32_t>(hello, kValidationMagic);
        const uint32_t nonce = static_cast<uint32_t>(::getpid());
        hello.push_back(static_cast<char>(kPing));
        Append<uint32_t>(hello, nonce);
        STRATA_RETURN_IF_ERROR(c.Send(hello, deadline));
        uint32_t echo = 0;
        absl::Status s = c.Receive(&echo, sizeof(echo), deadline);
        if (!s.ok() || echo != nonce) {
          return absl::FailedPreconditionError(
              absl::StrCat("the listener at ", where, " does not answer as torch.distributed's TCPStore (",
                           s.ok() ? "a wrong answer to a ping" : std::string(s.message()), ")"));
        }
        return c;
      }
      last_errno = errno;
      ::close(fd);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the store may not be listening yet
  }
  ::freeaddrinfo(res);
  return absl::DeadlineExceededError(absl::StrCat(
      "no TCPStore answered at ", where, " before the deadline (last error: ", std::strerror(last_errno), ")"));
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

// Moves up to n bytes once the socket is ready (poll for `send`'s direction), before the deadline: the count
// moved, 0 to retry (an interrupted call), or the error.
absl::StatusOr<size_t> TcpStoreClient::Move(char* p, size_t n, bool send, Clock::time_point deadline) {
  pollfd pfd{fd_, static_cast<short>(send ? POLLOUT : POLLIN), 0};
  const int ready = ::poll(&pfd, 1, RemainingMs(deadline));
  if (ready == 0) {
    return absl::DeadlineExceededError(absl::StrCat(send ? "writing to" : "waiting for", " the TCPStore at ", where_));
  }
  if (ready < 0) {
    if (errno == EINTR) return size_t{0};
    return ErrnoError("poll", errno, __FILE__, __LINE__);
  }
  const ssize_t k = send ? ::send(fd_, p, n, MSG_NOSIGNAL) : ::recv(fd_, p, n, 0);
  if (k == 0 && !send) {
    return absl::UnavailableError(absl::StrCat("the TCPStore at ", where_, " closed the connection"));
  }
  if (k < 0) {
    if (errno == EINTR || errno == EAGAIN) return size_t{0};
    return Annotate(ErrnoError(send ? "send" : "recv", errno, __FILE__, __LINE__),
                    absl::StrCat("the TCPStore at ", where_));
  }
  return static_cast<size_t>(k);
}

absl::Status TcpStoreClient::Send(const std::string& bytes, Clock::time_point deadline) {
  for (size_t done = 0; done < bytes.size();) {
    STRATA_ASSIGN_OR_RETURN(const size_t k,
                            Move(const_cast<char*>(bytes.data()) + done, bytes.size() - done, true, deadline));
    done += k;
  }
  return absl::OkStatus();
}

absl::Status TcpStoreClient::Receive(void* out, size_t n, Clock::time_point deadline) {
  for (size_t done = 0; done < n;) {
    STRATA_ASSIGN_OR_RETURN(const size_t k, Move(static_cast<char*>(out) + done, n - done, false, deadline));
    done += k;
  }
  return absl::OkStatus();
}

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value, Clock::time_point deadline) {
  std::string q = Query(kSet, key);
  AppendBytes(q, value);
  return Send(q, deadline);
}

absl::StatusOr<bool> TcpStoreClient::Check(const std::string& key, Clock::time_point deadline) {
  std::string q(1, static_cast<char>(kCheck));
  Append<uint64_t>(q, 1);
  AppendBytes(q, "/" + key);
  STRATA_RETURN_IF_ERROR(Send(q, deadline));
  uint8_t ready = 1;
  STRATA_RETURN_IF_ERROR(Receive(&ready, 1, deadline));
  return ready == 0;
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, Clock::time_point deadline) {
  STRATA_RETURN_IF_ERROR(Send(Query(kGet, key), deadline));
  uint64_t size = 0;
  STRATA_RETURN_IF_ERROR(Receive(&size, sizeof(size), deadline));
  if (size > (uint64_t{1} << 24)) {
    return absl::DataLossError(absl::StrCat("the TCPStore at ", where_, " answered a value of ", size, " bytes"));
  }
  std::string value(size, '\0');
  STRATA_RETURN_IF_ERROR(Receive(value.data(), size, deadline));
  return value;
}

absl::StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta, Clock::time_point deadline) {
  std::string q = Query(kAdd, key);
  Append<int64_t>(q, delta);
  STRATA_RETURN_IF_ERROR(Send(q, deadline));
  int64_t value = 0;
  STRATA_RETURN_IF_ERROR(Receive(&value, sizeof(value), deadline));
  return value;
}

}  // namespace strata::comm
