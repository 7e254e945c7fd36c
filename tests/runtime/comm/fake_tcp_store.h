// A stand-in for torch.distributed's TCPStore server in tests, speaking the subset of Note [TCPStore protocol]
// (runtime/comm/tcp_store.h) that Strata's client uses. It binds port 0 and keeps that socket for its whole life,
// so its port cannot be taken between its choice and its use. The real server is tested against the client by
// tests/python/test_launch.py (torchrun's agent store).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace strata::comm {

class FakeTcpStore {
 public:
  FakeTcpStore();  // listening when constructed
  ~FakeTcpStore();
  int port() const { return port_; }
  bool Has(const std::string& key);  // as torch names it (without the leading "/")

 private:
  void Serve();

  int listener_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::map<std::string, std::string> kv_;
  std::thread thread_;
};

}  // namespace strata::comm
