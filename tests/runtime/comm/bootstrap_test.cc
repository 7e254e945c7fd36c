// The torchrun-style bootstrap: environment parsing and the TCP exchange of one blob (the ncclUniqueId)
// among local processes' stand-ins (threads), including a late rank 0, a missing rank 0, a rank claimed
// twice and a wrong world size.
#include "runtime/comm/bootstrap.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;

// A port that was free a moment ago (bind to 0, read it back, close).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The exchange on `port` (MASTER_PORT is not used by the exchange itself).
TorchrunEnv Env(int rank, int world, int port) { return TorchrunEnv{rank, world, rank, "127.0.0.1", port - 1, port}; }

// A socket listening on loopback `port` (0: any), standing for torchrun's rendezvous store; -1 if taken.
int Listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(ParseTorchrunEnv, ReadsAndValidatesTheVariables) {
  auto e = ParseTorchrunEnv({"3", "8", "1", "node0", "29500"});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->exchange_port, 29501) << "MASTER_PORT is torchrun's own store; the exchange uses the next port";
  EXPECT_EQ(ParseTorchrunEnv({"0", "2", "0", "h", "29500", "31000"})->exchange_port, 31000) << "STRATA_BOOTSTRAP_PORT";
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "2", "0", "h", "29500", "0"}).status().message()),
              HasSubstr("STRATA_BOOTSTRAP_PORT='0'"));
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "2", "0", "h", "65535"}).status().message()),
              HasSubstr("set STRATA_BOOTSTRAP_PORT"));
  EXPECT_EQ(ParseTorchrunEnv({"2", "4", std::nullopt, "h", "1"})->local_rank, 2) << "LOCAL_RANK defaults to RANK";
  EXPECT_EQ(ParseTorchrunEnv({}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ParseTorchrunEnv({"4", "4", "0", "h", "1"}).status().message()), HasSubstr("RANK='4'"));
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "x", "0", "h", "1"}).status().message()), HasSubstr("WORLD_SIZE='x'"));
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "2", "0", "h", "70000"}).status().message()),
              HasSubstr("MASTER_PORT"));
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "2", "0", std::nullopt, "1"}).status().message()),
              HasSubstr("MASTER_ADDR"));
}

TEST(ExchangeBlob, EveryRankReceivesRankZerosBlobEvenWhenRankZeroStartsLate) {
  const int world = 4, port = FreePort();
  const std::string id(128, '\x7f');
  std::vector<absl::StatusOr<std::string>> got(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r) {
    threads.emplace_back([&, r] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      got[r] = ExchangeBlob(Env(r, world, port), r == 0 ? id : "", 10000);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], id) << "rank " << r;
  }
}

TEST(ExchangeBlob, MissingRankZeroIsADeadlineNamingTheAddress) {
  const int port = FreePort();
  const auto t0 = std::chrono::steady_clock::now();
  auto s = ExchangeBlob(Env(1, 2, port), "", 300).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ExchangeBlob, MissingPeerIsNamedByRankZero) {
  const int port = FreePort();
  std::thread one([&] { ExchangeBlob(Env(1, 3, port), "", 2000).IgnoreError(); });
  auto s = ExchangeBlob(Env(0, 3, port), "id", 500).status();
  one.join();
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2")) << s;
}

TEST(ExchangeBlob, ARankClaimedTwiceOrAWrongWorldSizeIsAnError) {
  const int port = FreePort();
  std::thread a([&] { ExchangeBlob(Env(1, 3, port), "", 1000).IgnoreError(); });
  std::thread b([&] { ExchangeBlob(Env(1, 3, port), "", 1000).IgnoreError(); });
  auto s = ExchangeBlob(Env(0, 3, port), "id", 3000).status();
  a.join();
  b.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const int port2 = FreePort();
  std::thread c([&] { ExchangeBlob(Env(1, 5, port2), "", 1000).IgnoreError(); });
  auto s2 = ExchangeBlob(Env(0, 2, port2), "id", 3000).status();
  c.join();
  EXPECT_THAT(std::string(s2.message()), HasSubstr("world size 5")) << s2;
}

// torchrun's agent keeps its rendezvous store listening on MASTER_PORT for the whole job. The exchange,
// parsed from the variables as a launch would, serves on the port above it, so it works beside it.
TEST(ExchangeBlob, WorksBesideTorchrunsStoreOnMasterPort) {
  int store = -1, master_port = 0;
  for (int attempt = 0; attempt < 50 && store < 0; ++attempt) {  // a port P listened on, P + 1 free
    master_port = FreePort();
    const int above = Listen(master_port + 1);
    if (above < 0) continue;
    ::close(above);
    store = Listen(master_port);
  }
  ASSERT_GE(store, 0) << "no pair of free ports";
  const std::string mp = std::to_string(master_port);
  auto e0 = ParseTorchrunEnv({"0", "2", "0", "127.0.0.1", mp});
  auto e1 = ParseTorchrunEnv({"1", "2", "1", "127.0.0.1", mp});
  ASSERT_TRUE(e0.ok() && e1.ok());
  absl::StatusOr<std::string> got1 = absl::UnknownError("not run");
  std::thread one([&] { got1 = ExchangeBlob(*e1, "", 10000); });
  auto got0 = ExchangeBlob(*e0, "the id", 10000);
  one.join();
  ::close(store);
  ASSERT_TRUE(got0.ok()) << got0.status();
  ASSERT_TRUE(got1.ok()) << got1.status();
  EXPECT_EQ(*got1, "the id");
}

// A taken exchange port is an error that says which variable moves it.
TEST(ExchangeBlob, ATakenExchangePortNamesTheVariable) {
  const int taken = Listen(0);
  ASSERT_GE(taken, 0);
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len);
  auto s = ExchangeBlob(Env(0, 2, ntohs(a.sin_port)), "id", 1000).status();
  ::close(taken);
  EXPECT_THAT(std::string(s.message()), HasSubstr("STRATA_BOOTSTRAP_PORT")) << s;
}

}  // namespace
}  // namespace strata::comm
