// Tests for tools/bench_nvme: fio JSON parsing, flag validation, and a small end-to-end run on a
// scratch directory (against fio when it is installed) that checks the reported keys and that nothing
// is left behind.
#include "tools/bench/bench_nvme.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

namespace strata::tools {
namespace {

using ::testing::HasSubstr;

TEST(BenchNvme, ReadsFioBandwidthAfterLeadingNoise) {
  const std::string out =
      "fio: note: something harmless\n"
      R"({"fio version": "fio-3.33", "jobs": [{"jobname": "x", "read": {"bw_bytes": 1500000000},
          "write": {"bw_bytes": 2500000000}}]})";
  EXPECT_EQ(*FioBandwidth(out, /*read=*/true), 1.5e9);
  EXPECT_EQ(*FioBandwidth(out, /*read=*/false), 2.5e9);
  EXPECT_EQ(FioBandwidth("no json here", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FioBandwidth(R"({"jobs": []})", true).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BenchNvme, ValidatesFlags) {
  bool json = false;
  EXPECT_THAT(std::string(ParseNvmeBenchOptions({}, &json).status().message()), HasSubstr("--path DIR is required"));
  EXPECT_THAT(std::string(ParseNvmeBenchOptions({"--path", "/tmp", "--block-bytes", "1000"}, &json).status().message()),
              HasSubstr("not a positive multiple of 4096"));
  EXPECT_FALSE(ParseNvmeBenchOptions({"--path", "/tmp", "--backend", "aio"}, &json).ok());
  auto o = ParseNvmeBenchOptions({"--path", "/a,/b", "--block-bytes", "4MiB", "--queue-depth", "8", "--total-bytes",
                                  "10MiB", "--backend", "threads", "--json"},
                                 &json);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(o->block_bytes, 4u << 20);
  EXPECT_EQ(o->total_bytes, 8u << 20) << "rounded down to whole blocks";
  EXPECT_EQ(o->backend, offload::IoBackend::kThreads);
  EXPECT_TRUE(json);
}

TEST(BenchNvme, SmallRunReportsStoreAndFioThroughput) {
  std::string dir = (std::filesystem::temp_directory_path() / "strata-bench-nvme-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  NvmeBenchOptions o;
  o.paths = {dir};
  o.block_bytes = 1 << 20;
  o.queue_depth = 4;
  o.total_bytes = 8 << 20;
  o.repeat = 1;
  auto j = RunNvmeBench(o);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_GT((*j)["read_bytes_per_s"].get<double>(), 0);
  EXPECT_GT((*j)["write_bytes_per_s"].get<double>(), 0);
  EXPECT_FALSE((*j)["fs_type"].get<std::string>().empty());
  if (j->contains("fio_ioengine")) {
    EXPECT_GT((*j)["fio_read_bytes_per_s"].get<double>(), 0);
    EXPECT_GT((*j)["fio_write_bytes_per_s"].get<double>(), 0);
    EXPECT_GT((*j)["read_ratio"].get<double>(), 0);
    EXPECT_THAT((*j)["fio_command"].get<std::string>(), HasSubstr("--direct=1"));
  } else {
    EXPECT_TRUE(j->contains("fio")) << "says why fio did not run";
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the store's files are removed";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::tools
