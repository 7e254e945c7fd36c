// `strata plan --host-figures FILE`: a fixed `strata doctor --measure --json` report gives the same plan as
// the equivalent flags (every rate, alpha included), explicit flags override the file, the sgemm figure
// follows the ranks per node, what the doctor's own renderer writes is what the plan reads, and every bad
// file (missing, not JSON, no facts, no host_figures, a missing or mistyped key, a rate not measured, a
// shape not measured, every truncation of a good one) is refused naming the file and the key. And the
// host's cores in the time model: one core per rank serialises compute and communication, two overlap them.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/doctor/doctor_report.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_host_figures.h"
#include "tools/plan/plan_options.h"

namespace strata::tools::plan {
namespace {

// What `strata doctor --measure --json --ranks 2` writes, the figures only (the rest of a report is ignored).
nlohmann::json Report() {
  return nlohmann::json::parse(R"({
    "verdict": "warn", "checks": [],
    "facts": {"cpu_cores": 2, "host_figures": {
      "ranks": 2, "omp_num_threads": "1", "sgemm_shape": [512, 128, 512],
      "matmul_gflops": 61.5, "matmul_gflops_one_rank": 140.25, "update_gbps": 9.5, "update_error": "",
      "launcher": "/usr/bin/mpirun", "comm_bytes": 4194304, "alpha_bytes": 4096,
      "allgather_gbps": 1.75, "reduce_scatter_gbps": 0.625, "allreduce_gbps": 0.875, "alpha_us": 12.5,
      "comm_error": "", "seconds": 3.2}}})");
}

class HostFiguresFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_plan_figures_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& text, const char* name = "doctor.json") {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

const std::vector<std::string> kJob = {"--device-preset", "host", "--model", "gpt2-tiny", "--stage", "3",
                                       "--micro-batch", "4", "--ranks", "2", "--ranks-per-node", "2"};

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Plan PlanOf(const std::vector<std::string>& args) {
  absl::StatusOr<PlanRequest> r = ParsePlanArgs(args);
  EXPECT_TRUE(r.ok()) << r.status();
  absl::StatusOr<Plan> p = Evaluate(r->in);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::string ErrorOf(const std::vector<std::string>& args) {
  absl::StatusOr<PlanRequest> r = ParsePlanArgs(args);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : std::string(r.status().message());
}

void ExpectSameDevice(const DeviceSpec& a, const DeviceSpec& b) {
  EXPECT_EQ(a.matmul_flops, b.matmul_flops);
  EXPECT_EQ(a.memory_bytes_per_s, b.memory_bytes_per_s);
  EXPECT_EQ(a.host_memory_bytes_per_s, b.host_memory_bytes_per_s);
  EXPECT_EQ(a.intra.alpha_s, b.intra.alpha_s);
  EXPECT_EQ(a.intra.all_gather_bytes_per_s, b.intra.all_gather_bytes_per_s);
  EXPECT_EQ(a.intra.reduce_scatter_bytes_per_s, b.intra.reduce_scatter_bytes_per_s);
  EXPECT_EQ(a.intra.all_reduce_bytes_per_s, b.intra.all_reduce_bytes_per_s);
  EXPECT_EQ(a.inter.alpha_s, b.inter.alpha_s);
}

TEST_F(HostFiguresFile, GivesTheSamePlanAsTheEquivalentFlags) {
  const std::string path = Write(Report().dump());
  const Plan file = PlanOf(With(kJob, {"--host-figures", path}));
  const Plan flags = PlanOf(With(kJob, {"--matmul-gflops", "61.5", "--update-gbps", "9.5", "--allgather-gbps", "1.75",
                                        "--reduce-scatter-gbps", "0.625", "--allreduce-gbps", "0.875", "--alpha-us",
                                        "12.5"}));
  EXPECT_EQ(file.in.device.cores_per_node, 2);  // facts.cpu_cores
  const Plan flags_cores = PlanOf(With(kJob, {"--matmul-gflops", "61.5", "--update-gbps", "9.5", "--allgather-gbps",
                                              "1.75", "--reduce-scatter-gbps", "0.625", "--allreduce-gbps", "0.875",
                                              "--alpha-us", "12.5", "--cores-per-node", "2"}));
  ExpectSameDevice(file.in.device, flags_cores.in.device);
  EXPECT_EQ(file.time.step_s, flags_cores.time.step_s);
  EXPECT_EQ(file.time.exposed_comm_s, flags_cores.time.exposed_comm_s);
  EXPECT_GT(file.time.step_s, flags.time.step_s);  // flags alone: cores unknown, the overlap is free
  ExpectSameDevice(file.in.device, flags.in.device);
  EXPECT_EQ(file.time.optimizer_s, flags.time.optimizer_s);
  EXPECT_GT(file.time.gather_s, 0);  // stage 3 at 2 ranks: the collectives are in the answer
  EXPECT_GT(file.in.device.intra.alpha_s, 0);
}

TEST_F(HostFiguresFile, OneRankPerNodeTakesTheSgemmMeasuredAlone) {
  const std::string path = Write(Report().dump());
  const std::vector<std::string> one = {"--device-preset", "host", "--model", "gpt2-tiny", "--ranks", "1"};
  const Plan file = PlanOf(With(one, {"--host-figures", path}));
  const Plan flags = PlanOf(With(one, {"--matmul-gflops", "140.25", "--update-gbps", "9.5"}));
  ExpectSameDevice(file.in.device, flags.in.device);
  EXPECT_EQ(file.time.step_s, flags.time.step_s);
}

TEST_F(HostFiguresFile, ExplicitFlagsOverrideTheFile) {
  const std::string path = Write(Report().dump());
  const Plan p = PlanOf(With(kJob, {"--host-figures", path, "--matmul-gflops", "10", "--intra-gbps", "3",
                                    "--alpha-us", "0", "--update-gbps", "2"}));
  EXPECT_EQ(p.in.device.matmul_flops, 10e9);
  EXPECT_EQ(p.in.device.intra.all_gather_bytes_per_s, 3e9);
  EXPECT_EQ(p.in.device.intra.reduce_scatter_bytes_per_s, 3e9);
  EXPECT_EQ(p.in.device.intra.all_reduce_bytes_per_s, 3e9);
  EXPECT_EQ(p.in.device.intra.alpha_s, 0);
  EXPECT_EQ(p.in.device.host_memory_bytes_per_s, 2e9);
  // One collective's flag overrides that one only.
  const Plan q = PlanOf(With(kJob, {"--host-figures", path, "--reduce-scatter-gbps", "5"}));
  EXPECT_EQ(q.in.device.intra.reduce_scatter_bytes_per_s, 5e9);
  EXPECT_EQ(q.in.device.intra.all_gather_bytes_per_s, 1.75e9);
  EXPECT_EQ(q.in.device.matmul_flops, 61.5e9);
}

TEST_F(HostFiguresFile, WhatTheDoctorWritesIsWhatThePlanReads) {
  doctor::DoctorFacts f;
  f.host.measured = true;
  f.host.ranks = 2;
  f.host.matmul_gflops = 33.25;
  f.host.matmul_gflops_one_rank = 70.5;
  f.host.update_gbps = 4.5;
  f.host.allgather_gbps = 2.5;
  f.host.reduce_scatter_gbps = 1.25;
  f.host.allreduce_gbps = 1.5;
  f.host.alpha_us = 7.75;
  const std::string path = Write(doctor::RenderJson(f, {}));
  absl::StatusOr<HostFigures> h = ReadHostFigures(path);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->ranks, 2);
  EXPECT_EQ(h->matmul_gflops, 33.25);
  EXPECT_EQ(h->matmul_gflops_one_rank, 70.5);
  EXPECT_EQ(h->update_gbps, 4.5);
  EXPECT_EQ(h->allgather_gbps, 2.5);
  EXPECT_EQ(h->reduce_scatter_gbps, 1.25);
  EXPECT_EQ(h->allreduce_gbps, 1.5);
  EXPECT_EQ(h->alpha_us, 7.75);
  // Without --measure the doctor writes no figures, and the plan says what to run.
  const std::string plain = Write(doctor::RenderJson(doctor::DoctorFacts{}, {}), "plain.json");
  EXPECT_NE(ErrorOf(With(kJob, {"--host-figures", plain})).find("facts.host_figures' is missing (run `strata doctor "
                                                                "--measure --json`)"),
            std::string::npos);
}

TEST_F(HostFiguresFile, BadFilesAreRefusedNamingTheFileAndTheKey) {
  auto expect = [&](const std::string& text, const std::vector<std::string>& extra, const std::string& words) {
    const std::string path = Write(text);
    const std::string e = ErrorOf(With(With(kJob, {"--host-figures", path}), extra));
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(words), std::string::npos) << "want '" << words << "' in: " << e;
  };
  EXPECT_NE(ErrorOf(With(kJob, {"--host-figures", (dir_ / "none.json").string()})).find("none.json"),
            std::string::npos);
  expect("{\"facts\": ", {}, "is not valid JSON");
  expect("[1, 2]", {}, "field 'the document' must be an object");
  expect("{}", {}, "field 'facts' is missing");
  expect("{\"facts\": {}}", {}, "field 'facts.host_figures' is missing");
  {
    nlohmann::json j = Report();
    j["facts"].erase("cpu_cores");
    expect(j.dump(), {}, "field 'facts.cpu_cores' is missing");
  }
  for (const char* key : {"ranks", "matmul_gflops", "matmul_gflops_one_rank", "update_gbps", "allgather_gbps",
                          "reduce_scatter_gbps", "allreduce_gbps", "alpha_us", "comm_error"}) {
    nlohmann::json j = Report();
    j["facts"]["host_figures"].erase(key);
    expect(j.dump(), {}, std::string("field 'facts.host_figures.") + key + "' is missing");
  }
  nlohmann::json j = Report();
  j["facts"]["host_figures"]["allgather_gbps"] = "fast";
  expect(j.dump(), {}, "field 'facts.host_figures.allgather_gbps'");
  j = Report();
  j["facts"]["host_figures"]["update_gbps"] = -1;
  expect(j.dump(), {}, "field 'facts.host_figures.update_gbps' must be in [0, 1e9)");
  j = Report();
  j["facts"]["host_figures"]["ranks"] = 0;
  expect(j.dump(), {}, "field 'facts.host_figures.ranks'");
  // The collectives not measured (no launcher): the doctor's reason is passed on, and a flag is the way out.
  j = Report();
  for (const char* k : {"allgather_gbps", "reduce_scatter_gbps", "allreduce_gbps", "alpha_us"})
    j["facts"]["host_figures"][k] = 0;
  j["facts"]["host_figures"]["comm_error"] = "no MPI launcher (mpirun, mpiexec, srun) on PATH; give --launcher";
  expect(j.dump(), {}, "facts.host_figures.allgather_gbps is 0 (not measured: no MPI launcher");
  expect(j.dump(), {"--allgather-gbps", "1"}, "facts.host_figures.reduce_scatter_gbps is 0");
  EXPECT_TRUE(ParsePlanArgs(With(kJob, {"--host-figures", Write(j.dump()), "--intra-gbps", "1"})).ok());
  // ... and they are not needed on one rank.
  EXPECT_TRUE(ParsePlanArgs({"--device-preset", "host", "--ranks", "1", "--host-figures", Write(j.dump())}).ok());
  // Measured for 2 ranks per node; the plan has 4 sharing a node.
  const std::vector<std::string> four = {"--device-preset", "host", "--ranks", "4", "--ranks-per-node", "4",
                                         "--host-figures"};
  const std::string good = Write(Report().dump(), "good.json");
  EXPECT_NE(ErrorOf(With(four, {good})).find("facts.host_figures.matmul_gflops was measured with 2 ranks per node, the "
                                             "plan has 4; rerun `strata doctor --measure --ranks 4 --json`"),
            std::string::npos)
      << ErrorOf(With(four, {good}));
  EXPECT_NE(ErrorOf(With(four, {good, "--matmul-gflops", "9"})).find("facts.host_figures.allgather_gbps was measured "
                                                                     "over 2 ranks"),
            std::string::npos);
  // A GPU preset has its own figures.
  EXPECT_NE(ErrorOf({"--device-preset", "h100-sxm", "--host-figures", good})
                .find("--host-figures is for --device-preset host"),
            std::string::npos);
}

// Stage 3 at 2 ranks: with one core per rank every gather and reduction costs its full time (each is
// counted once in the schedule, so the exposed communication is all of it); with two per rank the overlap
// is the engine's schedule, exactly as with the cores unknown.
TEST(PlanTimeOnHostCores, OneCorePerRankSerialisesCommunicationTwoOverlapIt) {
  const std::vector<std::string> job = With(kJob, {"--matmul-gflops", "20", "--update-gbps", "10", "--intra-gbps",
                                                   "0.5", "--alpha-us", "10"});
  const Plan unknown = PlanOf(job);
  const Plan one = PlanOf(With(job, {"--cores-per-node", "2"}));
  const Plan two = PlanOf(With(job, {"--cores-per-node", "4"}));
  const Plan half = PlanOf(With(job, {"--cores-per-node", "1"}));
  EXPECT_DOUBLE_EQ(one.time.exposed_comm_s, one.time.gather_s + one.time.reduce_s);
  EXPECT_DOUBLE_EQ(one.time.step_s, one.time.compute_s + one.time.gather_s + one.time.reduce_s + one.time.optimizer_s);
  EXPECT_DOUBLE_EQ(half.time.step_s, one.time.step_s);  // fewer cores than ranks: the rates already share them
  EXPECT_EQ(two.time.step_s, unknown.time.step_s);
  EXPECT_LT(unknown.time.exposed_comm_s, 0.5 * one.time.exposed_comm_s);
  EXPECT_EQ(one.time.compute_s, unknown.time.compute_s);
  // One rank: nothing to contend with.
  const std::vector<std::string> single = {"--device-preset", "host", "--model", "gpt2-tiny", "--ranks", "1",
                                           "--matmul-gflops", "20", "--update-gbps", "10"};
  EXPECT_EQ(PlanOf(With(single, {"--cores-per-node", "1"})).time.step_s, PlanOf(single).time.step_s);
}

TEST(HostFiguresParse, EveryTruncationOfAGoodReportIsRefusedWithAName) {
  const std::string text = Report().dump();
  for (size_t n = 0; n < text.size(); ++n) {
    absl::StatusOr<HostFigures> h = ParseHostFigures(text.substr(0, n), "cut.json");
    ASSERT_FALSE(h.ok()) << n;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << h.status();
    EXPECT_NE(h.status().message().find("cut.json"), std::string::npos) << h.status();
  }
  EXPECT_TRUE(ParseHostFigures(text, "whole.json").ok());
}

}  // namespace
}  // namespace strata::tools::plan
