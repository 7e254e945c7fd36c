// Tests for tools/doctor_checks (the verdicts, on hand-written facts: fake NVML topology tables, version
// sets, core counts, limits), tools/doctor_report (the JSON parses and carries checks and facts) and
// the NVMe probe (a real, small disk test under a temporary directory that leaves nothing behind).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "models/gpt/model/gpt_config.h"
#include "models/gpt/spec/gpt_spec.h"
#include "tests/offload/offload_test_util.h"
#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/doctor_measure.h"
#include "tools/doctor/doctor_probe.h"
#include "tools/doctor/doctor_report.h"
#include "tools/plan/plan.h"

namespace strata::tools::doctor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;

GpuFacts Gpu(int index, const std::string& name = "NVIDIA H100 80GB HBM3", uint64_t mem = 80 * kGiB) {
  GpuFacts g;
  g.index = index;
  g.name = name;
  g.memory_bytes = mem;
  g.pcie_gen = g.pcie_max_gen = 5;
  g.pcie_width = g.pcie_max_width = 16;
  g.sm_clock_mhz = 1980;
  g.sm_max_clock_mhz = 1980;
  return g;
}

// A healthy machine: n identical GPUs, all pairs under one PCIe switch, 8 cores per GPU, ample RAM.
DoctorFacts Healthy(int n) {
  DoctorFacts f;
  f.nvml_loaded = true;
  for (int i = 0; i < n; ++i) f.gpus.push_back(Gpu(i));
  f.topology.assign(n, std::vector<int>(n, kTopoSingle));
  f.nvlink.assign(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) f.topology[i][i] = kTopoInternal;
  f.versions = {"550.54.15", 12040, 12040, "", 21903, ""};
  f.cpu_cores = 8 * n;
  f.host_ram_bytes = 2 * 80 * kGiB * n;
  f.memlock_limit_bytes = kUnlimited;
  f.io_uring_ok = true;
  f.nvme.skipped_reason = "no --nvme-path";
  f.mpi = {true, "Open MPI v4.1.4", "/usr/bin/mpirun", 0};
  return f;
}

// The facts of a machine without a driver (this CI machine).
DoctorFacts NoGpu() {
  DoctorFacts f = Healthy(0);
  f.nvml_loaded = false;
  f.nvml_error = "libnvidia-ml.so.1: cannot open shared object file";
  f.versions = {"", 0, 13000, "", 22703, ""};
  f.cpu_cores = 2;
  f.host_ram_bytes = 24 * kGiB;
  return f;
}

TEST(DoctorChecks, HealthyMachineIsAllOk) {
  const auto checks = RunChecks(Healthy(8));
  for (const CheckResult& c : checks) EXPECT_EQ(c.verdict, Verdict::kOk) << c.name << ": " << c.detail;
  EXPECT_EQ(checks.size(), 13u);
}

TEST(DoctorChecks, CrossSocketPairIsFlaggedWarn) {
  // nvidia-smi topo -m of two sockets with two GPUs each behind a PCIe switch: PIX inside, SYS across.
  DoctorFacts f = Healthy(4);
  const int S = kTopoSingle, X = kTopoSystem, I = kTopoInternal;
  f.topology = {{I, S, X, X}, {S, I, X, X}, {X, X, I, S}, {X, X, S, I}};
  const CheckResult c = CheckInterconnect(f);
  EXPECT_EQ(c.verdict, Verdict::kWarn) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("0-2 0-3 1-2 1-3 cross the CPU socket"));
  EXPECT_THAT(c.detail, HasSubstr("2 PCIe switch, 4 cross-socket"));
}

TEST(DoctorChecks, NvlinkPairsAreOkEvenAcrossSockets) {
  DoctorFacts f = Healthy(2);
  f.topology = {{kTopoInternal, kTopoSystem}, {kTopoSystem, kTopoInternal}};
  f.nvlink = {{false, true}, {true, false}};
  const CheckResult c = CheckInterconnect(f);
  EXPECT_EQ(c.verdict, Verdict::kOk) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("1 NVLink"));
}

TEST(DoctorChecks, HostBridgeAndNumaNodeAreOkButNamed) {
  DoctorFacts f = Healthy(3);
  f.topology = {{0, kTopoHostBridge, kTopoNode}, {kTopoHostBridge, 0, kTopoMultiple}, {kTopoNode, kTopoMultiple, 0}};
  const CheckResult c = CheckInterconnect(f);
  EXPECT_EQ(c.verdict, Verdict::kOk) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("1 host bridge"));
  EXPECT_THAT(c.detail, HasSubstr("1 NUMA node"));
}

TEST(DoctorChecks, UnreadableTopologyWarns) {
  DoctorFacts f = Healthy(2);
  f.topology = {{0, kTopoUnknown}, {kTopoUnknown, 0}};
  EXPECT_EQ(CheckInterconnect(f).verdict, Verdict::kWarn);
  f.topology.clear();
  EXPECT_EQ(CheckInterconnect(f).verdict, Verdict::kWarn);
}

TEST(DoctorChecks, MismatchedGpuModelsFail) {
  DoctorFacts f = Healthy(4);
  f.gpus[3] = Gpu(3, "NVIDIA A100-SXM4-80GB");
  const CheckResult c = CheckGpus(f);
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_THAT(c.detail, HasSubstr("1 x NVIDIA A100-SXM4-80GB"));
  EXPECT_THAT(c.detail, HasSubstr("3 x NVIDIA H100 80GB HBM3"));
}

TEST(DoctorChecks, SameModelDifferentMemoryFails) {
  DoctorFacts f = Healthy(2);
  f.gpus[1].memory_bytes = 40 * kGiB;
  EXPECT_EQ(CheckGpus(f).verdict, Verdict::kFail);
  f.gpus[1].memory_bytes = 80 * kGiB - (kGiB / 1000);  // ECC-sized differences are noise
  EXPECT_EQ(CheckGpus(f).verdict, Verdict::kOk);
}

TEST(DoctorChecks, CudaVisibleDevicesHidingEverythingWarns) {
  DoctorFacts f = Healthy(2);
  f.cuda_visible_devices = "";
  EXPECT_EQ(CheckGpus(f).verdict, Verdict::kWarn);
  f.cuda_visible_devices = "0,1";
  EXPECT_EQ(CheckGpus(f).verdict, Verdict::kOk);
  EXPECT_THAT(CheckGpus(f).detail, HasSubstr("CUDA_VISIBLE_DEVICES=0,1"));
}

TEST(DoctorChecks, VersionSetsThatFit) {
  DoctorFacts f = Healthy(1);
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kOk) << CheckVersions(f).detail;
  f.versions = {"570.86.10", 12080, 12040, "", 22105, ""};  // newer driver than runtime: fine
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kOk) << CheckVersions(f).detail;
  EXPECT_THAT(CheckVersions(f).detail, HasSubstr("driver 570.86.10 (CUDA 12.8), runtime 12.4, NCCL 2.21.5"));
}

TEST(DoctorChecks, VersionSetsThatDoNotFit) {
  DoctorFacts f = Healthy(1);
  f.versions = {"535.104.05", 12020, 13000, "", 22703, ""};  // CUDA 13 runtime on a CUDA 12 driver
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kFail);
  EXPECT_THAT(CheckVersions(f).detail, HasSubstr("update the driver"));
  f.versions = {"535.104.05", 12020, 12040, "", 21903, ""};  // minor-version compatibility
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kWarn);
  f.versions = {"550.54.15", 12040, 12040, "", 21403, ""};  // NCCL 2.14 predates CUDA 12
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kWarn);
  EXPECT_THAT(CheckVersions(f).detail, HasSubstr("first built for it: 2.16.2"));
  f.versions = {"550.54.15", 12040, 12040, "", 2708, ""};  // old encoding (2.7.8) with CUDA 12
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kWarn);
  f.versions = {"550.54.15", 12040, 12040, "", 0, "libnccl.so.2: cannot open"};
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kWarn);
  f.versions = {"550.54.15", 12040, 0, "libcudart.so: cannot open", 21903, ""};
  EXPECT_EQ(CheckVersions(f).verdict, Verdict::kWarn);
}

TEST(DoctorChecks, VersionTexts) {
  EXPECT_EQ(CudaVersionText(12040), "12.4");
  EXPECT_EQ(CudaVersionText(13000), "13.0");
  EXPECT_EQ(CudaVersionText(0), "not found");
  EXPECT_EQ(NcclVersionText(21903), "2.19.3");
  EXPECT_EQ(NcclVersionText(2708), "2.7.8");
  EXPECT_EQ(ThrottleText(0), "none");
  EXPECT_EQ(ThrottleText(kThrottleGpuIdle | kThrottleHwThermal), "idle,hw_thermal");
}

TEST(DoctorChecks, TooFewCoresPerGpuWarns) {
  DoctorFacts f = Healthy(8);
  f.cpu_cores = 16;
  const CheckResult c = CheckCpuCores(f);
  EXPECT_EQ(c.verdict, Verdict::kWarn);
  EXPECT_THAT(c.detail, HasSubstr("2.0 cores per GPU (16 cores / 8 GPUs)"));
  f.cpu_cores = 32;
  EXPECT_EQ(CheckCpuCores(f).verdict, Verdict::kOk);
  f.cpu_cores = 128;
  EXPECT_EQ(CheckCpuCores(f).verdict, Verdict::kOk);
}

TEST(DoctorChecks, LessRamThanVramWarns) {
  DoctorFacts f = Healthy(8);
  f.host_ram_bytes = 512 * kGiB;  // < 640 GiB of VRAM
  EXPECT_EQ(CheckHostRam(f).verdict, Verdict::kWarn);
}

TEST(DoctorChecks, NarrowedPcieLinkWarnsButIdleDownshiftDoesNot) {
  DoctorFacts f = Healthy(2);
  f.gpus[0].pcie_gen = 1;  // idle GPUs drop to gen 1
  EXPECT_EQ(CheckPcie(f).verdict, Verdict::kOk) << CheckPcie(f).detail;
  f.gpus[1].pcie_width = 8;
  EXPECT_EQ(CheckPcie(f).verdict, Verdict::kWarn);
  EXPECT_THAT(CheckPcie(f).detail, HasSubstr("GPU 1 runs x8 of x16"));
}

TEST(DoctorChecks, ThermalThrottlingWarnsIdleDoesNot) {
  DoctorFacts f = Healthy(2);
  f.gpus[0].throttle_reasons = kThrottleGpuIdle;
  EXPECT_EQ(CheckClocks(f).verdict, Verdict::kOk);
  f.gpus[1].throttle_reasons = kThrottleHwThermal;
  EXPECT_EQ(CheckClocks(f).verdict, Verdict::kWarn);
  EXPECT_THAT(CheckClocks(f).detail, HasSubstr("GPU 1 hw_thermal"));
}

TEST(DoctorChecks, NoGpuIsInformativeNeverFail) {
  const DoctorFacts f = NoGpu();
  const auto checks = RunChecks(f);
  EXPECT_NE(Worst(checks), Verdict::kFail);
  EXPECT_EQ(checks[0].name, "gpus");
  EXPECT_EQ(checks[0].verdict, Verdict::kWarn);
  EXPECT_THAT(checks[0].detail, HasSubstr("no GPU visible"));
  for (const char* name : {"versions", "interconnect", "pcie", "clocks", "cpu_cores", "host_ram"}) {
    for (const CheckResult& c : checks) {
      if (c.name == name) {
        EXPECT_EQ(c.verdict, Verdict::kOk) << name << ": " << c.detail;
      }
    }
  }
}

TEST(DoctorChecks, IoUringRefusedWarns) {
  DoctorFacts f = Healthy(1);
  f.io_uring_ok = false;
  f.io_uring_error = "io_uring_queue_init: Operation not permitted (errno 1)";
  EXPECT_EQ(CheckIoUring(f).verdict, Verdict::kWarn);
  EXPECT_THAT(CheckIoUring(f).detail, HasSubstr("errno 1"));
}

TEST(DoctorChecks, NvmeVerdicts) {
  DoctorFacts f = Healthy(1);
  EXPECT_EQ(CheckNvme(f).verdict, Verdict::kOk);  // not tested
  f.nvme = {"/mnt/nvme", "", "", true, 256 << 20, 3e9, 6e9};
  EXPECT_EQ(CheckNvme(f).verdict, Verdict::kOk) << CheckNvme(f).detail;
  f.nvme.read_bytes_per_s = 0.3e9;
  EXPECT_EQ(CheckNvme(f).verdict, Verdict::kWarn);
  f.nvme.error = "statvfs failed: No such file or directory (errno 2)";
  EXPECT_EQ(CheckNvme(f).verdict, Verdict::kFail);
}

// A disk too full for the bandwidth test (it writes at most a quarter of the free space, at least 16 MiB) is
// no verdict on the disk: the test is skipped saying why, and whether the job fits is nvme_space's.
TEST(DoctorChecks, DiskTooFullForTheBandwidthTestIsSkippedNotFailed) {
  offload::testing::TmpfsMount disk("size=40m");
  if (!disk.ok()) GTEST_SKIP() << disk.reason();
  const NvmeFacts n = ProbeNvme(disk.path(), 16 << 20, 5);  // 10 MiB is a quarter of the free space
  EXPECT_EQ(n.error, "");
  EXPECT_EQ(n.test_bytes, 0u);
  EXPECT_THAT(n.skipped_reason, HasSubstr("40.00 MiB (41943040 bytes) free"));
  EXPECT_THAT(n.skipped_reason, HasSubstr("so it needs 64.00 MiB free"));
  EXPECT_TRUE(std::filesystem::is_empty(disk.path()));
  DoctorFacts f = Healthy(1);
  f.nvme = n;
  const CheckResult c = CheckNvme(f);
  EXPECT_EQ(c.verdict, Verdict::kOk) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("bandwidth not measured"));
  EXPECT_THAT(c.detail, HasSubstr("see nvme_space"));
}

// R ranks of the node on one disk: below R x need the job cannot start (each rank preallocates its stores);
// below R x (need + room) it trains, the steps over an asynchronous save waiting for its writer; else ok.
TEST(DoctorChecks, NvmeSpaceVerdictsCountEveryRankOfTheNode) {
  DoctorFacts f = Healthy(4);
  EXPECT_EQ(CheckNvmeSpace(f).verdict, Verdict::kOk);
  EXPECT_THAT(CheckNvmeSpace(f).detail, HasSubstr("nothing on NVMe"));
  f.nvme_space.offloaded = true;
  f.nvme_space.ranks = 8;
  f.nvme_space.ranks_on_node = 4;
  NvmeDiskFacts d;
  d.path = "/mnt/t1";
  d.stores = "optimizer state";
  d.need_per_rank = 1000;
  d.room_per_rank = 1000;
  f.nvme_space.disks = {d};
  auto at = [&](uint64_t free) {
    f.nvme_space.disks[0].free_bytes = free;
    const CheckResult c = CheckNvmeSpace(f);
    EXPECT_EQ(c.name, "nvme_space");
    EXPECT_THAT(c.detail, HasSubstr("checkpoints saved on the same disk need their own room besides")) << free;
    EXPECT_THAT(c.detail, HasSubstr("/mnt/t1 (optimizer state)")) << free;
    return c;
  };
  CheckResult c = at(3999);
  EXPECT_EQ(c.verdict, Verdict::kFail) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("needs 4 ranks x 1000 B (1000 bytes) = 3.91 KiB (4000 bytes)"));
  EXPECT_THAT(c.detail, HasSubstr("(3999 bytes) free: the job cannot start"));
  c = at(4000);
  EXPECT_EQ(c.verdict, Verdict::kWarn) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("steps over an asynchronous checkpoint wait for its writer"));
  c = at(7999);
  EXPECT_EQ(c.verdict, Verdict::kWarn) << c.detail;
  c = at(8000);
  EXPECT_EQ(c.verdict, Verdict::kOk) << c.detail;
  EXPECT_THAT(c.detail, HasSubstr("(8000 bytes)"));
  f.nvme_space.ranks_on_node = 1;  // the other ranks on other nodes: one rank's need
  EXPECT_EQ(at(1000).verdict, Verdict::kWarn);
  // Parameter shards have no room to want: their need alone decides.
  f.nvme_space.disks[0].room_per_rank = 0;
  EXPECT_EQ(at(1000).verdict, Verdict::kOk);
  EXPECT_EQ(at(999).verdict, Verdict::kFail);
  // The worst disk decides; a path that cannot be read fails naming it.
  NvmeDiskFacts missing;
  missing.path = "/mnt/gone";
  missing.stores = "parameter shards";
  missing.error = "statvfs failed: No such file or directory (errno 2)";
  f.nvme_space.disks.push_back(missing);
  c = at(1 << 20);
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_THAT(c.detail, HasSubstr("/mnt/gone (parameter shards): statvfs failed"));
  f.nvme_space.disks.clear();
  f.nvme_space.error = "layout failed";
  EXPECT_EQ(CheckNvmeSpace(f).verdict, Verdict::kWarn);
}

// The need is the engine's NVMe tier as `strata plan` computes it, split by store: the optimizer state (whose
// store the room repeats) on offload_optimizer.nvme_path, the parameter shards on offload_param's.
TEST(DoctorNvmeSpace, EstimateIsThePlansNvmeTierByDirectory) {
  engine::EngineConfig cfg;
  cfg.stage = 3;
  const std::shared_ptr<const spec::ModelSpec> model = gpt::Spec(*gpt::GptPreset("gpt2"));
  absl::StatusOr<NvmeSpaceFacts> none = EstimateNvmeSpace(cfg, model, 8, 8);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->offloaded);
  EXPECT_TRUE(none->disks.empty());

  cfg.offload_optimizer.device = cfg.offload_param.device = engine::OffloadDevice::kNvme;
  cfg.offload_optimizer.nvme_path = "/mnt/a";
  cfg.offload_param.nvme_path = "/mnt/b";
  plan::PlanInput in;
  in.model = model;
  in.engine = cfg;
  in.ranks = 8;
  in.device.gpu = false;
  const absl::StatusOr<plan::MemoryPlan> m = plan::PlanMemory(in);
  ASSERT_TRUE(m.ok()) << m.status();
  const uint64_t nvme = m->engine.tier[2], room = m->engine.nvme_room;
  ASSERT_GT(room, 0u);
  ASSERT_GT(nvme, room);
  absl::StatusOr<NvmeSpaceFacts> two = EstimateNvmeSpace(cfg, model, 8, 4);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->offloaded);
  EXPECT_EQ(two->ranks, 8);
  EXPECT_EQ(two->ranks_on_node, 4);
  ASSERT_EQ(two->disks.size(), 2u);
  EXPECT_EQ(two->disks[0].path, "/mnt/a");
  EXPECT_EQ(two->disks[0].stores, "optimizer state");
  EXPECT_EQ(two->disks[0].need_per_rank, room);
  EXPECT_EQ(two->disks[0].room_per_rank, room);
  EXPECT_EQ(two->disks[1].path, "/mnt/b");
  EXPECT_EQ(two->disks[1].stores, "parameter shards");
  EXPECT_EQ(two->disks[1].need_per_rank, nvme - room);
  EXPECT_EQ(two->disks[1].room_per_rank, 0u);

  cfg.offload_param.nvme_path = "/mnt/a";  // one directory: one disk, both stores
  absl::StatusOr<NvmeSpaceFacts> one = EstimateNvmeSpace(cfg, model, 8, 8);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->disks.size(), 1u);
  EXPECT_EQ(one->disks[0].stores, "optimizer state + parameter shards");
  EXPECT_EQ(one->disks[0].need_per_rank, nvme);
  EXPECT_EQ(one->disks[0].room_per_rank, room);

  // Shard groups of the node: each rank holds an eighth of the world's state as a quarter of its group's.
  cfg.shard_group_size = engine::kShardGroupNode;
  absl::StatusOr<NvmeSpaceFacts> grouped = EstimateNvmeSpace(cfg, model, 8, 4);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_GT(grouped->disks[0].need_per_rank, 3 * nvme / 2);
}

// Two directories of one file system share its free bytes: one entry, the needs summed; a missing path keeps
// its entry, with the error.
TEST(DoctorProbe, NvmeSpaceReadsFreeBytesAndJoinsOneFileSystem) {
  offload::testing::TmpfsMount disk("size=1m");
  if (!disk.ok()) GTEST_SKIP() << disk.reason();
  std::filesystem::create_directories(disk.path() + "/params");
  NvmeSpaceFacts s;
  s.offloaded = true;
  s.disks.resize(3);
  s.disks[0] = {disk.path(), "optimizer state", "", 0, 100, 100};
  s.disks[1] = {disk.path() + "/params", "parameter shards", "", 0, 50, 0};
  s.disks[2] = {"/nonexistent/strata-doctor", "parameter shards", "", 0, 10, 0};
  ProbeNvmeSpace(&s);
  ASSERT_EQ(s.disks.size(), 2u);
  EXPECT_EQ(s.disks[0].path, disk.path() + ", " + disk.path() + "/params");
  EXPECT_EQ(s.disks[0].stores, "optimizer state + parameter shards");
  EXPECT_EQ(s.disks[0].need_per_rank, 150u);
  EXPECT_EQ(s.disks[0].room_per_rank, 100u);
  EXPECT_EQ(s.disks[0].free_bytes, uint64_t{1} << 20);
  EXPECT_EQ(s.disks[0].error, "");
  EXPECT_THAT(s.disks[1].error, HasSubstr("No such file or directory"));
  DoctorFacts f = Healthy(1);
  f.nvme_space = s;
  EXPECT_EQ(CheckNvmeSpace(f).verdict, Verdict::kFail);
}

TEST(DoctorChecks, MpiWithoutLauncherWarns) {
  DoctorFacts f = Healthy(1);
  f.mpi.launcher_path = "";
  EXPECT_EQ(CheckMpi(f).verdict, Verdict::kWarn);
  f.mpi.launcher_world_size = 4;  // started by one anyway
  EXPECT_EQ(CheckMpi(f).verdict, Verdict::kOk);
}

TEST(DoctorChecks, LaunchUnderTorchrun) {
  DoctorFacts f = Healthy(2);
  EXPECT_EQ(CheckLaunch(f).verdict, Verdict::kOk) << "not a torchrun launch";
  f.launch = LaunchFacts{true, 1, 2, "node0:29501", "", 3.5, "node0"};
  CheckResult c = CheckLaunch(f);
  EXPECT_EQ(c.verdict, Verdict::kOk) << c.detail;
  EXPECT_NE(c.detail.find("rank 1 of 2"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("(node0) at node0:29501"), std::string::npos) << c.detail;
  f.gpus.clear();
  c = CheckLaunch(f);
  EXPECT_EQ(c.verdict, Verdict::kWarn) << "no GPU: the host back-end refuses the launch";
  EXPECT_NE(c.detail.find("use mpirun"), std::string::npos) << c.detail;
  f.launch.size = 1;
  EXPECT_EQ(CheckLaunch(f).verdict, Verdict::kOk) << "one rank runs anywhere";
  f.launch.error = "bootstrap: rank 1 could not reach rank 0 at node0:29501";
  c = CheckLaunch(f);
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_EQ(c.detail, f.launch.error);
  f.launch.torchrun = false;
  f.mpi.launcher_world_size = 2;
  EXPECT_NE(CheckMpi(f).detail.find("started by a launcher"), std::string::npos);
  f.launch.torchrun = true;
  EXPECT_NE(CheckMpi(f).detail.find("torchrun"), std::string::npos) << "MPI runs as singletons under torchrun";
}

TEST(DoctorPinned, NothingOffloadedNeedsNoPinnedMemory) {
  const PinnedFacts p = EstimatePinned(engine::EngineConfig{}, *gpt::Spec(*gpt::GptPreset("gpt2")), 8);
  EXPECT_FALSE(p.offloaded);
  EXPECT_EQ(p.bytes_per_rank, 0u);
  DoctorFacts f = Healthy(8);
  f.memlock_limit_bytes = 64 << 10;
  f.pinned = p;
  EXPECT_EQ(CheckMemlock(f).verdict, Verdict::kOk);
  EXPECT_THAT(CheckMemlock(f).detail, HasSubstr("nothing is offloaded"));
}

TEST(DoctorPinned, OptimizerOnCpuPinsSixteenBytesPerParamOverRanks) {
  engine::EngineConfig cfg;
  cfg.offload_optimizer.device = engine::OffloadDevice::kCpu;
  const gpt::GptConfig model = *gpt::GptPreset("gpt2");
  const uint64_t params = static_cast<uint64_t>(gpt::NumParams(model));
  const PinnedFacts p = EstimatePinned(cfg, *gpt::Spec(model), 8);
  EXPECT_TRUE(p.offloaded && p.pinned);
  EXPECT_EQ(p.bytes_per_rank, 16 * ((params + 7) / 8));
  cfg.offload_optimizer.pin_memory = false;
  EXPECT_EQ(EstimatePinned(cfg, *gpt::Spec(model), 8).bytes_per_rank, 0u);
}

TEST(DoctorPinned, NvmeOffloadPinsStagingBuffers) {
  engine::EngineConfig cfg;
  cfg.param_dtype = DType::kBF16;
  cfg.offload_param.device = engine::OffloadDevice::kNvme;
  cfg.offload_param.buffer_count = 5;
  const gpt::GptConfig model = *gpt::GptPreset("gpt2");
  const uint64_t embed = (50257ull + 1024) * 768;  // the largest unit
  EXPECT_EQ(EstimatePinned(cfg, *gpt::Spec(model), 1).bytes_per_rank, 5 * ((2 * embed + 4095) / 4096 * 4096));
  cfg.offload_param.buffer_count = 1;  // at least one more than the gathered units that can be live
  EXPECT_EQ(EstimatePinned(cfg, *gpt::Spec(model), 1).bytes_per_rank, 3 * ((2 * embed + 4095) / 4096 * 4096));
}

TEST(DoctorPinned, MemlockTooLowForPinnedBuffersFails) {
  engine::EngineConfig cfg;
  cfg.stage = 3;
  cfg.offload_optimizer.device = engine::OffloadDevice::kCpu;
  DoctorFacts f = Healthy(8);
  f.pinned = EstimatePinned(cfg, *gpt::Spec(*gpt::GptPreset("gpt2")), 8);
  f.memlock_limit_bytes = 8 << 20;  // Debian's default 8 MiB
  const CheckResult c = CheckMemlock(f);
  EXPECT_EQ(c.verdict, Verdict::kFail);
  EXPECT_THAT(c.detail, HasSubstr("limit 8.00 MiB <"));
  EXPECT_THAT(c.detail, HasSubstr("ulimit -l unlimited"));
  // Root (CAP_IPC_LOCK) locks past the limit: the job pins, so the low limit is no failure, and the detail says
  // whose job would still need it raised.
  f.lock_past_limit = true;
  EXPECT_EQ(CheckMemlock(f).verdict, Verdict::kOk);
  EXPECT_THAT(CheckMemlock(f).detail, HasSubstr("CAP_IPC_LOCK"));
  f.lock_past_limit = false;
  f.memlock_limit_bytes = kUnlimited;
  EXPECT_EQ(CheckMemlock(f).verdict, Verdict::kOk);
}

TEST(DoctorReport, JsonCarriesChecksAndFacts) {
  const DoctorFacts f = NoGpu();
  const auto checks = RunChecks(f);
  const nlohmann::json j = nlohmann::json::parse(RenderJson(f, checks));
  EXPECT_EQ(j["verdict"], "warn");
  EXPECT_EQ(j["checks"].size(), checks.size());
  EXPECT_EQ(j["checks"][0]["name"], "gpus");
  EXPECT_EQ(j["facts"]["gpu_count"], 0);
  EXPECT_EQ(j["facts"]["nvml"]["loaded"], false);
  EXPECT_EQ(j["facts"]["memlock_limit_bytes"], "unlimited");
  EXPECT_EQ(j["facts"]["versions"]["nccl_text"], "2.27.3");
}

TEST(DoctorReport, TableAlignsColumnsAndSummarises) {
  DoctorFacts f = Healthy(2);
  f.gpus[1].name = "other";
  const std::string t = RenderTable(RunChecks(f));
  EXPECT_THAT(t, HasSubstr("check         verdict  detail\n"));
  EXPECT_THAT(t, HasSubstr("gpus          FAIL     GPUs differ"));
  EXPECT_THAT(t, HasSubstr("1 fail, 0 warn, 12 ok: fix the failed checks"));
}

// Runs on any machine: with a driver (or the fake NVML of tests/tools/doctor/fake_nvml.c on LD_LIBRARY_PATH)
// the GPU list and the topology matrix agree in size; without one the reason is recorded.
TEST(DoctorProbe, GpuProbeRecordsGpusOrWhyNot) {
  DoctorFacts f;
  ProbeGpus(&f);
  if (!f.nvml_loaded) {
    EXPECT_NE(f.nvml_error, "");
    EXPECT_TRUE(f.gpus.empty());
    return;
  }
  ASSERT_EQ(f.topology.size(), f.gpus.size());
  ASSERT_EQ(f.nvlink.size(), f.gpus.size());
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    EXPECT_EQ(f.topology[i].size(), f.gpus.size());
    EXPECT_NE(f.gpus[i].name, "");
  }
}

// Only meaningful with tests/tools/doctor/fake_nvml.c's libnvidia-ml.so.1 on LD_LIBRARY_PATH: ctest runs it
// that way (doctor_test_fake_nvml); disabled in the plain run.
TEST(DoctorProbe, DISABLED_ReadsTheFakeNvmlMachine) {
  DoctorFacts f;
  ProbeGpus(&f);
  ASSERT_TRUE(f.nvml_loaded) << f.nvml_error;
  ASSERT_EQ(f.gpus.size(), 4u);
  EXPECT_EQ(f.versions.driver, "550.54.15");
  EXPECT_EQ(f.versions.driver_cuda, 12040);
  EXPECT_EQ(f.gpus[3].pcie_width, 8);
  EXPECT_EQ(f.gpus[3].pcie_max_width, 16);
  EXPECT_EQ(f.gpus[2].throttle_reasons, kThrottleHwThermal);
  EXPECT_EQ(f.gpus[2].sm_clock_mhz, 1200);
  EXPECT_EQ(f.gpus[0].memory_bytes, 85520809984u);
  EXPECT_EQ(f.topology[0][1], kTopoSingle);
  EXPECT_EQ(f.topology[1][3], kTopoSystem);
  EXPECT_FALSE(f.nvlink[0][1]);
  EXPECT_EQ(CheckInterconnect(f).verdict, Verdict::kWarn);
}

TEST(DoctorProbe, HostProbeReadsCoresRamAndLimits) {
  DoctorFacts f;
  ProbeHost(&f);
  ProbeLibraries(&f.versions);
  EXPECT_GE(f.cpu_cores, 1);
  EXPECT_GT(f.host_ram_bytes, 0u);
  EXPECT_GT(f.memlock_limit_bytes, 0u);
  EXPECT_TRUE(f.io_uring_ok || !f.io_uring_error.empty());
  EXPECT_TRUE(f.versions.cuda_runtime > 0 || !f.versions.cuda_runtime_error.empty());
  EXPECT_TRUE(f.versions.nccl > 0 || !f.versions.nccl_error.empty());
}

TEST(DoctorProbe, NvmeTestMeasuresAndLeavesNothingBehind) {
  const std::string dir = ::testing::TempDir() + "/doctor_nvme_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const NvmeFacts n = ProbeNvme(dir, 16 << 20, 5);
  EXPECT_EQ(n.error, "");
  EXPECT_EQ(n.test_bytes, uint64_t{16} << 20);
  EXPECT_GT(n.write_bytes_per_s, 0);
  EXPECT_GT(n.read_bytes_per_s, 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(DoctorProbe, NvmeTestOnAMissingPathNamesTheCall) {
  const NvmeFacts n = ProbeNvme("/nonexistent/strata-doctor", 16 << 20, 5);
  EXPECT_THAT(n.error, HasSubstr("statvfs"));
  EXPECT_THAT(n.error, HasSubstr("No such file or directory"));
  DoctorFacts f = Healthy(1);
  f.nvme = n;
  EXPECT_EQ(CheckNvme(f).verdict, Verdict::kFail);
}

// --measure's alpha from two all-gathers: bus bandwidths synthesised from a known alpha and link rate
// (t = (p-1) alpha + m / B, busbw = m / t, m = (p-1)/p x bytes) give them back.
TEST(DoctorMeasure, AlphaFromTwoSizesRecoversTheLatency) {
  for (int p : {2, 4, 8}) {
    const double alpha = 20e-6, bw = 3e9;
    auto busbw = [&](uint64_t bytes) {
      const double m = double(p - 1) / p * double(bytes);
      return m / ((p - 1) * alpha + m / bw) / 1e9;
    };
    const uint64_t small = 4096, big = uint64_t{4} << 20;
    EXPECT_NEAR(AlphaFromTwoSizes(small, busbw(small), big, busbw(big), p), alpha, 1e-12) << p;
  }
  EXPECT_EQ(AlphaFromTwoSizes(4096, 1, 1 << 20, 2, 1), 0);         // one rank: no ring step
  EXPECT_EQ(AlphaFromTwoSizes(4096, 0, 1 << 20, 2, 2), 0);         // not measured
  EXPECT_EQ(AlphaFromTwoSizes(4096, 100, 1 << 20, 0.001, 2), 0);   // the big buffer faster per byte: noise, no fit
  EXPECT_EQ(AlphaFromTwoSizes(1 << 20, 1, 1 << 20, 1, 2), 0);      // one size is no fit
}

TEST(DoctorMeasure, HostFiguresCheckShowsEveryFigureAndWhatIsMissing) {
  DoctorFacts f = Healthy(1);
  EXPECT_EQ(RunChecks(f).size(), 13u);  // not measured: no row
  f.host.measured = true;
  f.host.ranks = 2;
  f.host.omp_num_threads = "1";
  f.host.sgemm_m = 512;
  f.host.sgemm_k = 128;
  f.host.sgemm_n = 512;
  f.host.matmul_gflops = 50;
  f.host.matmul_gflops_one_rank = 100;
  f.host.update_gbps = 8;
  f.host.allgather_gbps = 1.5;
  f.host.reduce_scatter_gbps = 0.5;
  f.host.allreduce_gbps = 0.75;
  f.host.alpha_us = 12;
  const std::vector<CheckResult> all = RunChecks(f);
  ASSERT_EQ(all.size(), 14u);
  EXPECT_EQ(all.back().name, "host figures");
  EXPECT_EQ(all.back().verdict, Verdict::kOk);
  EXPECT_EQ(all.back().detail, "sgemm 50.0 GFLOP/s per rank at 2 ranks (100.0 alone; 512x128x512), update 8.00 GB/s, "
                               "all-gather 1.500 / reduce-scatter 0.500 / all-reduce 0.750 GB/s, alpha 12.0 us");
  f.host.comm_error = "no MPI launcher (mpirun, mpiexec, srun) on PATH; give --launcher";
  f.host.omp_num_threads = "";
  const CheckResult c = CheckHostFigures(f);
  EXPECT_EQ(c.verdict, Verdict::kWarn);
  EXPECT_THAT(c.detail, HasSubstr("collectives not measured: no MPI launcher"));
  EXPECT_THAT(c.detail, HasSubstr("OMP_NUM_THREADS unset"));
  EXPECT_THAT(c.detail, Not(HasSubstr("all-gather")));
  const nlohmann::ordered_json j = FactsToJson(f);
  for (const char* k : {"ranks", "matmul_gflops", "matmul_gflops_one_rank", "update_gbps", "allgather_gbps",
                        "reduce_scatter_gbps", "allreduce_gbps", "alpha_us", "comm_error", "update_error", "launcher",
                        "sgemm_shape", "omp_num_threads"}) {
    EXPECT_TRUE(j["host_figures"].contains(k)) << k;
  }
  EXPECT_FALSE(FactsToJson(Healthy(1)).contains("host_figures"));
}

}  // namespace
}  // namespace strata::tools::doctor
