#include "tests/runtime/comm/fake_tcp_store.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::comm {
namespace {

// One connection's unparsed input; Parse consumes complete queries and appends their answers.
struct Conn {
  int fd;
  std::string in;
};

template <typename T>
bool Take(const std::string& in, size_t& at, T* out) {
  if (in.size() - at < sizeof(T)) return false;
  std::memcpy(out, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

bool TakeBytes(const std::string& in, size_t& at, std::string* out) {
  uint64_t n = 0;
  if (!Take(in, at, &n) || in.size() - at < n) return false;
  *out = in.substr(at, n);
  at += n;
  return true;
}

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

FakeTcpStore::FakeTcpStore() {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a));  // port 0, and the socket is kept
  ::listen(listener_, 64);
  socklen_t len = sizeof(a);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  if (::pipe(wake_) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { Serve(); });
}

FakeTcpStore::~FakeTcpStore() {
  const char c = 0;
  (void)!::write(wake_[1], &c, 1);
  thread_.join();
  ::close(listener_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

bool FakeTcpStore::Has(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_.count("/" + key) > 0;
}

void FakeTcpStore::Serve() {
  std::vector<Conn> conns;
  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) break;
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) conns.push_back({fd, ""});
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Conn& c = conns[i - 2];
      char buf[4096];
      const ssize_t k = ::recv(c.fd, buf, sizeof(buf), 0);
      if (k <= 0) {
        ::close(c.fd);
        c.fd = -1;
        continue;
      }
      c.in.append(buf, static_cast<size_t>(k));
      std::string out;
      size_t at = 0;
      while (at < c.in.size()) {
        size_t q = at;
        uint8_t type = 0;
        std::string key, value;
        bool complete = Take(c.in, q, &type);
        std::lock_guard<std::mutex> lock(mu_);
        if (complete && (type == 0 || type == 13)) {  // VALIDATE, PING: a uint32
          uint32_t v = 0;
          complete = Take(c.in, q, &v);
          if (complete && type == 13) Put(out, v);
        } else if (complete && type == 1) {  // SET
          complete = TakeBytes(c.in, q, &key) && TakeBytes(c.in, q, &value);
          if (complete) kv_[key] = value;
        } else if (complete && type == 3) {  // GET
          complete = TakeBytes(c.in, q, &key);
          if (complete) {
            Put<uint64_t>(out, kv_[key].size());
            out += kv_[key];
          }
        } else if (complete && type == 4) {  // ADD
          int64_t delta = 0;
          complete = TakeBytes(c.in, q, &key) && Take(c.in, q, &delta);
          if (complete) {
            int64_t n = 0;
            if (kv_.count(key)) n = std::stoll(kv_[key]);
            kv_[key] = std::to_string(n + delta);
            Put<int64_t>(out, n + delta);
          }
        } else if (complete && type == 5) {  // CHECK
          uint64_t n = 0;
          complete = Take(c.in, q, &n);
          bool all = true;
          for (uint64_t j = 0; complete && j < n; ++j) {
            complete = TakeBytes(c.in, q, &key);
            all = all && kv_.count(key) > 0;
          }
          if (complete) Put<uint8_t>(out, all ? 0 : 1);
        } else if (complete) {  // not in the subset: drop the connection
          at = c.in.size();
          break;
        }
        if (!complete) break;
        at = q;
      }
      c.in.erase(0, at);
      if (!out.empty()) (void)!::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL);
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
  }
  for (const Conn& c : conns) ::close(c.fd);
}

}  // namespace strata::comm
