// The torchrun-style bootstrap: environment parsing, and the exchange of one blob (the ncclUniqueId) over
// torchrun's store (Note [Bootstrap over the store]) among local processes' stand-ins (threads), against a stand-in
// of torch's TCPStore that keeps its port: a late rank 0; a rank that never arrives, named by every rank at the
// deadline; a rank that cannot join, a rank claimed twice and a wrong world size, each failing every rank at once
// (well before a 60 s deadline: not DeadlineExceeded) naming it; no store at the address.
#include "runtime/comm/bootstrap.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/tcp_store.h"
#include "tests/runtime/comm/fake_tcp_store.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;
using Results = std::vector<absl::StatusOr<std::string>>;

TorchrunEnv Env(int rank, int world, int store_port) {
  TorchrunEnv e;
  e.rank = e.local_rank = rank;
  e.world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = store_port;
  e.agent_store = true;
  return e;
}

// One thread per entry of `envs`, each ExchangeBlob(env, "t", rank 0 ? "the id" : "", timeout, verdicts[i]), all
// started at once: each rank's deadline runs from its own start, so a thread started late would be missing at
// another's deadline.
Results RunRanks(const std::vector<TorchrunEnv>& envs, int64_t timeout_ms,
                 const std::vector<absl::Status>& verdicts = {}) {
  Results got(envs.size(), absl::UnknownError("not run"));
  std::latch started(static_cast<std::ptrdiff_t>(envs.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < envs.size(); ++i) {
    threads.emplace_back([&, i] {
      const absl::Status local = i < verdicts.size() ? verdicts[i] : absl::OkStatus();
      started.arrive_and_wait();
      got[i] = ExchangeBlob(envs[i], "t", envs[i].rank == 0 ? "the id" : "", timeout_ms, local);
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(ParseTorchrunEnv, ReadsAndValidatesTheVariables) {
  auto e = ParseTorchrunEnv({"3", "8", "1", "node0", "29500"});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->run_id, "none");
  EXPECT_EQ(e->restart_count, "0");
  EXPECT_FALSE(e->agent_store);
  EXPECT_THAT(std::string(ParseTorchrunEnv({"0", "2", "0", "h", "29500", "31000"}).status().message()),
              HasSubstr("unset STRATA_BOOTSTRAP_PORT"))
      << "the retired exchange port is refused by name";
  auto t = ParseTorchrunEnv({"1", "4", "1", "h", "29500", std::nullopt, "job7", "2", "True", "2"});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->run_id, "job7");
  EXPECT_EQ(t->restart_count, "2");
  EXPECT_TRUE(t->agent_store);
  EXPECT_EQ(t->local_world_size, 2);
  EXPECT_THAT(
      std::string(ParseTorchrunEnv({"1", "4", "1", "h", "1", std::nullopt, "j", "0", "True", "1"}).status().message()),
      HasSubstr("LOCAL_WORLD_SIZE='1'"))
      << "LOCAL_RANK 1 needs at least 2 local ranks";
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
  FakeTcpStore store;
  const int world = 4;
  Results got(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r) {
    threads.emplace_back([&, r] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      got[r] = ExchangeBlob(Env(r, world, store.port()), "t", r == 0 ? std::string(128, '\x7f') : "", 10000);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], std::string(128, '\x7f')) << "rank " << r;
  }
  EXPECT_TRUE(store.Has("strata/bootstrap/none/0/t/id")) << "the job's keys, under its run id and restart count";
}

TEST(ExchangeBlob, ExchangesOfAnotherNameOrAnotherRestartDoNotMix) {
  FakeTcpStore store;
  ASSERT_TRUE(RunRanks({Env(0, 2, store.port()), Env(1, 2, store.port())}, 10000)[1].ok());
  // The same name in the next restart of the worker group: rank 1 alone must not read the old id.
  TorchrunEnv late = Env(1, 2, store.port());
  late.restart_count = "1";
  auto s = ExchangeBlob(late, "t", "", 300).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 0 had not arrived")) << s;
}

TEST(ExchangeBlob, ARankThatNeverArrivesIsNamedByEveryRankAtTheDeadline) {
  FakeTcpStore store;
  Results got = RunRanks({Env(0, 3, store.port()), Env(1, 3, store.port())}, 500);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].status().code(), absl::StatusCode::kDeadlineExceeded) << got[r].status();
    EXPECT_THAT(std::string(got[r].status().message()), HasSubstr("rank(s) 2 had not arrived by the deadline"));
    EXPECT_THAT(std::string(got[r].status().message()),
                HasSubstr("torchrun's store at 127.0.0.1:" + std::to_string(store.port())));
  }
}

// A failure during the bootstrap reaches every rank within a poll: each fails with the failing rank's cause,
// not at the 60 s deadline (the code says which: FailedPrecondition, not DeadlineExceeded).
void ExpectEveryRankFailsNaming(const Results& got, const std::string& cause) {
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].status().code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << got[r].status();
    EXPECT_THAT(std::string(got[r].status().message()), HasSubstr(cause)) << "rank " << r;
  }
}

TEST(ExchangeBlob, ARankThatCannotJoinFailsEveryRankNamingIt) {
  FakeTcpStore store;
  const auto t0 = std::chrono::steady_clock::now();
  Results got = RunRanks({Env(0, 3, store.port()), Env(1, 3, store.port()), Env(2, 3, store.port())}, 60000,
                         {absl::OkStatus(), absl::OkStatus(), absl::FailedPreconditionError("no CUDA GPU here")});
  ExpectEveryRankFailsNaming(got, "rank 2 of 3: FAILED_PRECONDITION: no CUDA GPU here");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  FakeTcpStore other;  // rank 0 itself cannot join (no id): rank 1 does not wait for the id until the deadline
  got = RunRanks({Env(0, 2, other.port()), Env(1, 2, other.port())}, 60000,
                 {absl::InternalError("ncclGetUniqueId failed")});
  ExpectEveryRankFailsNaming(got, "rank 0 of 2: INTERNAL: ncclGetUniqueId failed");
}

TEST(ExchangeBlob, ARankStartedTwiceFailsEveryRankNamingIt) {
  FakeTcpStore store;
  Results got = RunRanks({Env(0, 3, store.port()), Env(1, 3, store.port()), Env(1, 3, store.port())}, 60000);
  // The second claimant fails and tells the others; the first may have arrived before.
  ExpectEveryRankFailsNaming(got, "RANK=1 was started twice");
}

TEST(ExchangeBlob, AWrongWorldSizeFailsEveryRankNamingIt) {
  FakeTcpStore store;
  Results got = RunRanks({Env(0, 2, store.port()), Env(1, 5, store.port())}, 60000);
  ExpectEveryRankFailsNaming(got, "rank 1 has WORLD_SIZE=5 and rank 0 WORLD_SIZE=2");
}

TEST(ExchangeBlob, NoStoreAtTheAddressIsNamed) {
  // A bound socket that does not listen: its port refuses connections, and stays ours.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  TorchrunEnv e = Env(1, 2, ntohs(a.sin_port));
  e.agent_store = false;
  auto s = ExchangeBlob(e, "t", "", 300).status();
  ::close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("no TCPStore answered at 127.0.0.1:" + std::to_string(e.master_port)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("TORCHELASTIC_USE_AGENT_STORE is not True"));
}

TEST(TcpStoreClient, SetCheckGetAndAdd) {
  FakeTcpStore store;
  const auto deadline = TcpStoreClient::Clock::now() + std::chrono::seconds(10);
  auto c = TcpStoreClient::Connect("127.0.0.1", store.port(), deadline);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(*c->Check("k", deadline));
  ASSERT_TRUE(c->Set("k", std::string("v\0w", 3), deadline).ok());
  EXPECT_TRUE(*c->Check("k", deadline));
  EXPECT_EQ(*c->Get("k", deadline), std::string("v\0w", 3));
  EXPECT_EQ(*c->Add("n", 2, deadline), 2);
  EXPECT_EQ(*c->Add("n", 3, deadline), 5);
  EXPECT_TRUE(store.Has("k"));
}

}  // namespace
}  // namespace strata::comm
