// Loading pretrained weights (engine::LoadPretrained, runtime/engine/pretrained_load.h) and the unit-at-once
// parameter writes it uses (Engine::SetParamRanges; docs/decisions/0043-unit-at-once-param-writes.md, issue #36).
// A load into an NVMe-offloaded engine gives the checkpoint's values bit for bit and writes at most one pass over
// the rank's NVMe master and parameter shards, at 1, 2 and 4 ranks, fp32 and bf16, stage 3 (both on NVMe) and
// stage 2 (the master on NVMe), with a frozen unit, every tensor arriving in many small reads. SetParamRanges
// gives what SetParamRange range by range gives, overlaps included, and refuses a bad range before it writes.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/pretrained_load.h"
#include "tests/runtime/checkpoint/write_tensors.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;
using shard::ParamSpec;
using ::testing::HasSubstr;

// Several units of several parameters each (so a per-range write would write each unit several times), one
// frozen. Registered in an order the file (sorted by name) does not follow.
struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;
};
std::vector<UnitSpec> Units() {
  auto p = [](std::string n, std::vector<int64_t> shape, bool frozen = false) {
    return ParamSpec{std::move(n), std::move(shape), false, shard::Init::Normal(0.3f), frozen};
  };
  return {UnitSpec{"zembed", {p("w", {96, 40})}}, UnitSpec{"block1", {p("w", {40, 40}), p("b", {40}), p("g", {40})}},
          UnitSpec{"block0", {p("w", {40, 40}), p("b", {40}), p("g", {40})}},
          UnitSpec{"base", {p("w", {40, 24}, true), p("b", {24}, true)}},
          UnitSpec{"head", {p("w", {40, 33}), p("b", {33})}}};
}

std::vector<float> ValuesOf(const std::string& name, int64_t numel) {
  std::mt19937 gen(static_cast<uint32_t>(std::hash<std::string>{}(name)));
  std::normal_distribution<float> d(0, 0.5f);
  std::vector<float> v(static_cast<size_t>(numel));
  for (float& x : v) x = d(gen);
  return v;
}

int64_t Numel(const ParamSpec& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  return n;
}

class EnginePretrained : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("pretrained_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every parameter as a tensor "unit.param" of model.safetensors.
  std::string WriteCheckpoint() {
    std::vector<checkpoint::testing::SourceTensor> tensors;
    for (const UnitSpec& u : Units()) {
      for (const ParamSpec& p : u.params) {
        const std::string name = u.name + "." + p.name;
        tensors.push_back({name, p.shape, [name, n = Numel(p)] { return ValuesOf(name, n); }});
      }
    }
    const std::string path = (dir_ / "model.safetensors").string();
    EXPECT_TRUE(checkpoint::testing::WriteTensors(path, tensors).ok());
    return path;
  }

  fs::path dir_;
};

struct Case {
  int world, stage;
  DType dtype;
};

TEST_F(EnginePretrained, LoadIntoNvmeWritesEachShardOnceAndGivesTheValues) {
  const std::string path = WriteCheckpoint();
  for (const Case& c : {Case{1, 3, DType::kF32}, Case{2, 3, DType::kF32}, Case{4, 3, DType::kF32},
                        Case{2, 3, DType::kBF16}, Case{4, 3, DType::kBF16}, Case{2, 2, DType::kF32}}) {
    const std::string what = absl::StrCat("world ", c.world, " stage ", c.stage, " ", DTypeName(c.dtype));
    const fs::path nvme = dir_ / absl::StrCat("nvme_", c.world, "_", c.stage, "_", DTypeName(c.dtype));
    fs::create_directories(nvme);
    EngineConfig cfg;
    cfg.stage = c.stage;
    cfg.param_dtype = c.dtype;
    cfg.offload_optimizer.device = OffloadDevice::kNvme;
    cfg.offload_optimizer.nvme_path = nvme.string();
    cfg.offload_optimizer.pin_memory = false;
    if (c.stage == 3) {
      cfg.offload_param.device = OffloadDevice::kNvme;
      cfg.offload_param.nvme_path = nvme.string();
      cfg.offload_param.pin_memory = false;
    }
    std::mutex mu;
    auto results = testing::RunRanks(c.world, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
      device::HostDevice dev;
      STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
      const std::vector<UnitSpec> units = Units();
      for (const UnitSpec& u : units) STRATA_RETURN_IF_ERROR(e->RegisterUnit(u.name, u.params).status());
      STRATA_RETURN_IF_ERROR(e->Finalize());
      STRATA_ASSIGN_OR_RETURN(auto ckpt, checkpoint::PretrainedCheckpoint::Open(path));
      std::vector<PretrainedTarget> targets;
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        for (int p = 0; p < static_cast<int>(units[u].params.size()); ++p) {
          const auto* t = ckpt->Find(units[u].name + "." + units[u].params[p].name);
          targets.push_back(PretrainedTarget{u, p, static_cast<size_t>(t - ckpt->tensors().data())});
        }
      }
      // Small reads: every tensor reaches the engine in many pieces of at most 1 KiB.
      checkpoint::RangeReadOptions ro;
      ro.staging_bytes = 4096;
      ro.request_bytes = 1024;
      ro.staging_buffers = 2;
      STRATA_ASSIGN_OR_RETURN(const Engine::NvmeTraffic before, e->nvme_traffic());
      STRATA_RETURN_IF_ERROR(LoadPretrained(*e, *ckpt, targets, ro).status());
      STRATA_ASSIGN_OR_RETURN(const Engine::NvmeTraffic after, e->nvme_traffic());
      // One pass: what the rank's master and parameter shards take on NVMe (each tile and shard rounded up to
      // the store's 4 KiB alignment, as the store writes them). Each unit's master and shard are written once.
      const MemoryStats mem = e->memory_stats();
      const auto nvme_tier = static_cast<int>(memory::Tier::kNvme);
      const uint64_t one_pass = mem.kind[nvme_tier][static_cast<int>(memory::Kind::kMaster)].current_bytes +
                                mem.kind[nvme_tier][static_cast<int>(memory::Kind::kParamShard)].current_bytes;
      const uint64_t written = after.written_bytes - before.written_bytes;
      EXPECT_GT(written, 0u) << what;
      EXPECT_LE(written, one_pass) << what << " rank " << rank;
      // The values, bit for bit (a frozen unit's master is its params: bf16-rounded there).
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        STRATA_ASSIGN_OR_RETURN(std::vector<float> full, e->GatherUnit(u));
        for (int p = 0; p < static_cast<int>(units[u].params.size()); ++p) {
          const shard::ParamSlot& slot = e->layout(u).params[p];
          const std::vector<float> want = ValuesOf(units[u].name + "." + slot.spec.name, slot.numel);
          const bool rounded = slot.spec.frozen && c.dtype == DType::kBF16;
          for (size_t i = 0; i < slot.numel; ++i) {
            const float w = rounded ? kernels::Bf16ToFloat(kernels::FloatToBf16(want[i])) : want[i];
            if (std::memcmp(&w, &full[slot.offset_elems + i], 4) != 0) {
              std::lock_guard<std::mutex> lock(mu);
              ADD_FAILURE() << what << ": " << units[u].name << "." << slot.spec.name << "[" << i << "] is "
                            << full[slot.offset_elems + i] << ", want " << w;
              return absl::OkStatus();
            }
          }
        }
      }
      return absl::OkStatus();
    });
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << what << ": " << s;
  }
}

// The unit's params after `write` at `world` ranks, stage 3 (NVMe when `nvme`), as rank 0 gathers them.
absl::StatusOr<std::vector<float>> AfterWrites(int world, const std::string& nvme,
                                               const std::function<absl::Status(Engine&)>& write) {
  EngineConfig cfg;
  cfg.stage = 3;
  if (!nvme.empty()) {
    cfg.offload_optimizer.device = cfg.offload_param.device = OffloadDevice::kNvme;
    cfg.offload_optimizer.nvme_path = cfg.offload_param.nvme_path = nvme;
    cfg.offload_optimizer.pin_memory = cfg.offload_param.pin_memory = false;
  }
  std::vector<float> out;
  auto results = testing::RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("block", Units()[1].params).status());
    STRATA_RETURN_IF_ERROR(e->Finalize());
    STRATA_RETURN_IF_ERROR(write(*e));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> full, e->GatherUnit(0));
    if (rank == 0) out = std::move(full);
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

TEST_F(EnginePretrained, SetParamRangesIsSetParamRangeInOrder) {
  const std::vector<float> a = ValuesOf("a", 1600), b = ValuesOf("b", 40), c = ValuesOf("c", 900);
  // Overlapping ranges of w (c over part of a), one of b, one empty: a later range wins.
  const std::vector<Engine::ParamValues> ranges = {
      {0, 0, a.data(), 1200}, {1, 3, b.data(), 30}, {0, 500, c.data(), 900}, {2, 40, b.data(), 0}};
  for (int world : {1, 2, 4}) {
    for (bool nvme : {false, true}) {
      auto dir = [&](const char* name) {
        if (!nvme) return std::string();
        const fs::path d = dir_ / absl::StrCat(name, world);
        fs::create_directories(d);
        return d.string();
      };
      auto one_by_one = AfterWrites(world, dir("one_by_one"), [&](Engine& e) {
        for (const Engine::ParamValues& r : ranges) {
          STRATA_RETURN_IF_ERROR(e.SetParamRange(0, r.param, r.offset, r.values, r.count));
        }
        return absl::OkStatus();
      });
      auto at_once = AfterWrites(world, dir("at_once"), [&](Engine& e) { return e.SetParamRanges(0, ranges); });
      ASSERT_TRUE(one_by_one.ok()) << one_by_one.status();
      ASSERT_TRUE(at_once.ok()) << at_once.status();
      ASSERT_EQ(one_by_one->size(), at_once->size());
      EXPECT_EQ(0, std::memcmp(one_by_one->data(), at_once->data(), 4 * at_once->size()))
          << "world " << world << (nvme ? " nvme" : "");
      // And the values are the ones given (w[500, 1400) from c, w[0, 500) from a, b[3, 33) from b).
      EXPECT_EQ((*at_once)[0], a[0]);
      EXPECT_EQ((*at_once)[499], a[499]);
      EXPECT_EQ((*at_once)[500], c[0]);
      EXPECT_EQ((*at_once)[1399], c[899]);
      EXPECT_EQ((*at_once)[1600 + 3], b[0]);
    }
  }
}

TEST_F(EnginePretrained, SetParamRangesRefusesABadRangeBeforeWritingAny) {
  const std::vector<float> a = ValuesOf("a", 1600);
  auto untouched = AfterWrites(1, "", [](Engine&) { return absl::OkStatus(); });
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  for (const auto& [bad, message] : std::vector<std::pair<Engine::ParamValues, std::string>>{
           {{1, 30, a.data(), 11}, "SetParam(block.b): elements [30, 41) of 40"},
           {{3, 0, a.data(), 1}, "SetParam(block): parameter 3 of 3"}}) {
    absl::Status refused;
    auto after = AfterWrites(1, "", [&](Engine& e) {
      const std::vector<Engine::ParamValues> ranges = {{0, 0, a.data(), 1600}, bad};
      refused = e.SetParamRanges(0, ranges);
      return absl::OkStatus();
    });
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_THAT(refused.message(), HasSubstr(message));
    EXPECT_EQ(0, std::memcmp(untouched->data(), after->data(), 4 * after->size())) << message;
  }
}

}  // namespace
}  // namespace strata::engine
