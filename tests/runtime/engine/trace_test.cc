// The Chrome trace recorder and writer (runtime/engine/trace.h): what `strata train --trace` and the C ABI
// write. The file must parse whatever the unit names hold, every rank's events must land in rank 0's file
// on one time axis, and the cap keeps the first events and counts the rest.
#include "runtime/engine/trace.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/device/host_device.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

nlohmann::json ParseEvents(const std::string& events) { return nlohmann::json::parse("[" + events + "]"); }

TEST(TraceRecorder, EscapesNamesSoTheFileParses) {
  const std::string hostile = "blk\"0\\\n\x01";
  TraceRecorder rec(0, {hostile, "b"});
  rec.Add(device::Span{"compute", "forward", 0, 1000, 3000});
  rec.Add(device::Span{"gather", "gather", 1, 500, 900});
  rec.Add(device::Span{"data", "data_wait", -1, 200, 400});
  const nlohmann::json ev = ParseEvents(rec.EventsJson(rec.first_ns()));
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& e : ev) {
    if (e["ph"] == "X") by_name[e["name"].get<std::string>()] = e;
  }
  ASSERT_EQ(by_name.count("forward " + hostile), 1u) << ev.dump();
  EXPECT_EQ(by_name["forward " + hostile]["args"]["unit"], hostile);
  EXPECT_EQ(by_name["forward " + hostile]["cat"], "forward");
  EXPECT_DOUBLE_EQ(by_name["forward " + hostile]["ts"].get<double>(), 0.8);  // us after the first event (200 ns)
  EXPECT_DOUBLE_EQ(by_name["forward " + hostile]["dur"].get<double>(), 2.0);
  EXPECT_EQ(by_name["gather b"]["args"]["unit"], "b");
  EXPECT_EQ(by_name["data_wait"]["args"], nlohmann::json::object()) << "no unit: no unit argument";
  EXPECT_NE(by_name["forward " + hostile]["tid"], by_name["gather b"]["tid"]) << "one track per stream";
}

TEST(TraceRecorder, KeepsTheFirstEventsAndCountsTheDropped) {
  TraceRecorder rec(0, {"u"}, /*max_events=*/2);
  for (int i = 0; i < 5; ++i) rec.Add(device::Span{"compute", "forward", 0, 100 * (i + 1), 100 * (i + 1) + 50});
  EXPECT_EQ(rec.dropped(), 3u);
  const nlohmann::json ev = ParseEvents(rec.EventsJson(0));
  int spans = 0;
  for (const auto& e : ev) spans += e["ph"] == "X";
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(rec.first_ns(), 100);
}

TEST(TraceRecorder, MemoryIsOneCounterPerTier) {
  TraceRecorder rec(0, {});
  MemoryStats m;
  m.tier[0].current_bytes = 4096;
  rec.Memory(77, m);
  const nlohmann::json ev = ParseEvents(rec.EventsJson(0));
  int counters = 0;
  for (const auto& e : ev) {
    if (e["ph"] != "C") continue;
    ++counters;
    if (e["name"] == "memory " + std::string(memory::TierName(memory::Tier::kDevice))) {
      EXPECT_EQ(e["args"]["bytes"], 4096);
    }
  }
  EXPECT_EQ(counters, memory::kNumTiers);
}

// Three ranks whose events start at different times (and carry different amounts of text): rank 0's file
// holds all of them, each under its own pid, on the time axis of the earliest event of any rank.
TEST(WriteTrace, GathersEveryRankIntoOneFileOnOneTimeAxis) {
  const std::string path = ::testing::TempDir() + "/trace_test.json";
  std::filesystem::remove(path);
  const auto results = testing::RunRanks(3, comm::Options{}, [&](int rank, comm::Communicator& world) -> absl::Status {
    device::HostDevice dev;
    auto stream = dev.CreateStream("trace");
    if (!stream.ok()) return stream.status();
    TraceRecorder rec(rank, {"unit_" + std::string(rank + 1, 'x')});
    for (int i = 0; i <= rank; ++i) {
      rec.Add(
          device::Span{"compute", "forward", 0, 10000 * (rank + 1) + 1000 * i, 10000 * (rank + 1) + 1000 * i + 500});
    }
    return WriteTrace(world, **stream, &rec, rank == 0 ? path : "/nonexistent/dir/only-rank-0-writes");
  });
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str());
  std::map<int, int> spans_per_rank;
  double earliest = 1e300;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"];
    ++spans_per_rank[pid];
    EXPECT_EQ(e["args"]["unit"], "unit_" + std::string(pid + 1, 'x'));
    earliest = std::min(earliest, e["ts"].get<double>());
    if (pid == 2 && spans_per_rank[pid] == 1) {
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 20.0);  // us: (30000 - 10000) ns after rank 0's first event
    }
  }
  EXPECT_EQ(spans_per_rank, (std::map<int, int>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_DOUBLE_EQ(earliest, 0.0);
}

// Rank 0 cannot open the file, or one rank cannot take part at all: every rank returns an error at once
// (a deadline of 2 s would fail the ranks left waiting), rank 0's naming the path, the others naming it.
TEST(WriteTrace, ARankThatCannotTakePartFailsEveryRankAtOnce) {
  for (int failing : {0, 2}) {
    comm::Options options;
    options.timeout_ms = 2000;
    const auto results = testing::RunRanks(3, options, [&](int rank, comm::Communicator& world) -> absl::Status {
      device::HostDevice dev;
      auto stream = dev.CreateStream("trace");
      if (!stream.ok()) return stream.status();
      TraceRecorder rec(rank, {});
      if (failing == 2 && rank == 2) {
        return WriteTrace(world, **stream, nullptr, "", absl::FailedPreconditionError("rank 2 is not recording"));
      }
      const std::string path = failing == 0 ? "/nonexistent/dir/trace.json" : ::testing::TempDir() + "/t.json";
      return WriteTrace(world, **stream, &rec, path);
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_FALSE(results[r].ok()) << "failing " << failing << ", rank " << r;
      EXPECT_NE(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
      const std::string want = r == failing ? (failing == 0 ? "/nonexistent/dir/trace.json" : "rank 2 is not recording")
                                            : "rank(s) " + std::to_string(failing) + " could not take part";
      EXPECT_NE(results[r].message().find(want), std::string::npos) << "rank " << r << ": " << results[r];
    }
  }
}

}  // namespace
}  // namespace strata::engine
