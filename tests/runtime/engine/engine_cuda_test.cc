// The engine on a CUDA device (label gpu; skips where no GPU is visible): at world size 1, with the same
// synthetic gradients written into Grad() each micro-batch, the CUDA engine's weights equal the host
// engine's bit for bit (the optimizer kernels share the element math; clipping is off, so the norm's
// different summation order cannot change a coefficient), for stages 0-3, fp32 and bf16 params, and the
// optimizer offloaded to cpu and to nvme, and parameter shards on cpu and nvme (staged gathers); and with
// param groups of their own lr and weight decay, for AdamW, Adam with L2 and SGD.
// Unsupported placements are refused with a named reason.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/device/cuda_device_fixture.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

// With `groups`, unit b's parameters are in a param group of their own (Note [Param groups]): another lr, and
// for the weight another decay.
std::vector<shard::ParamSpec> Specs(int in, int out, bool groups) {
  std::vector<shard::ParamSpec> specs = {{"weight", {in, out}, true}, {"bias", {out}, false}};
  if (groups) {
    specs[0].own_lr = specs[1].own_lr = 3e-3;
    specs[0].own_weight_decay = 0.2;
  }
  return specs;
}

// Trains three units for `steps` steps of 2 micro-batches with gradient g = sin(0.37 i + 1.3 s + 0.11 k)
// (element i, step s, micro-batch k) and returns every parameter, gathered.
absl::StatusOr<std::vector<float>> Train(const EngineConfig& cfg, device::Device& dev, int steps, bool groups = false) {
  auto group = comm::CreateInProcessGroup(1, comm::Options{});
  STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, *group[0], dev));
  for (auto [name, in, out] : {std::tuple{"a", 16, 48}, std::tuple{"b", 48, 48}, std::tuple{"c", 48, 5}}) {
    STRATA_RETURN_IF_ERROR(e->RegisterUnit(name, Specs(in, out, groups && name == std::string("b"))).status());
  }
  STRATA_RETURN_IF_ERROR(e->Finalize());
  const bool cuda = dev.kind() == device::DeviceKind::kCuda;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < cfg.gradient_accumulation_steps; ++k) {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      for (int u = 0; u < e->num_units(); ++u) {
        STRATA_RETURN_IF_ERROR(e->BeginForward(u));
        STRATA_RETURN_IF_ERROR(e->EndForward(u));
      }
      for (int u = e->num_units() - 1; u >= 0; --u) {
        STRATA_RETURN_IF_ERROR(e->BeginBackward(u));
        for (int p = 0; p < 2; ++p) {
          const size_t n = e->layout(u).params[p].numel;
          std::vector<float> g(n), cur(n);
          for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * float(i) + 1.3f * float(s) + 0.11f * float(k + u + p));
          float* dst = e->Grad(u, p);
          if (cuda) {  // gradients accumulate, as a backward kernel would
            if (cudaMemcpy(cur.data(), dst, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
              return absl::InternalError("D2H");
            for (size_t i = 0; i < n; ++i) cur[i] += g[i];
            if (cudaMemcpy(dst, cur.data(), n * 4, cudaMemcpyHostToDevice) != cudaSuccess)
              return absl::InternalError("H2D");
          } else {
            for (size_t i = 0; i < n; ++i) dst[i] += g[i];
          }
        }
        STRATA_RETURN_IF_ERROR(e->EndBackward(u));
      }
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    }
    STRATA_RETURN_IF_ERROR(e->Step().status());
  }
  return e->GatherAllParams();
}

class EngineOnCuda : public device::testing::CudaDeviceFixture {
 protected:
  void SetUp() override {
    CudaDeviceFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dir_ = ::testing::TempDir() + "/engine_cuda_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  device::HostDevice host_;
  std::string dir_;
};

TEST_F(EngineOnCuda, MatchesTheHostEngineBitForBit) {
  struct Case {
    int stage;
    DType dtype;
    OffloadDevice optimizer;
    OffloadDevice params = OffloadDevice::kNone;  // stage 3: Note [Staged gathers]
  };
  using enum OffloadDevice;
  for (const Case& c : {Case{0, DType::kF32, kNone}, Case{1, DType::kF32, kNone}, Case{2, DType::kBF16, kNone},
                        Case{3, DType::kF32, kNone}, Case{3, DType::kBF16, kNone}, Case{2, DType::kF32, kCpu},
                        Case{3, DType::kBF16, kCpu}, Case{3, DType::kF32, kNvme}, Case{3, DType::kF32, kCpu, kCpu},
                        Case{3, DType::kBF16, kCpu, kCpu}, Case{3, DType::kBF16, kCpu, kNvme},
                        Case{3, DType::kF32, kNvme, kNvme}}) {
    EngineConfig cfg;
    cfg.stage = c.stage;
    cfg.param_dtype = c.dtype;
    cfg.gradient_accumulation_steps = 2;
    cfg.offload_optimizer.device = c.optimizer;
    cfg.offload_optimizer.nvme_path = dir_;
    cfg.offload_optimizer.pin_memory = false;
    cfg.offload_param.device = c.params;
    cfg.offload_param.nvme_path = dir_;
    cfg.offload_param.buffer_count = 1;  // 2 buffers for 3 units: shards are read back every step
    cfg.nvme_tile_elems = 1024;
    auto want = Train(cfg, host_, 4);
    auto got = Train(cfg, *cuda_, 4);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*want, *got) << "stage " << c.stage << " " << DTypeName(c.dtype) << " optimizer offload "
                           << static_cast<int>(c.optimizer) << " param offload " << static_cast<int>(c.params);
  }
}

// Param groups (Note [Param groups]): the device kernels take each segment's group coefficients as the host's
// do, for AdamW, Adam with L2 and SGD, on the device and with the optimizer on the host.
TEST_F(EngineOnCuda, ParamGroupsMatchTheHostEngineBitForBit) {
  for (const int kind : {0, 1, 2}) {
    for (const auto& [stage, optimizer] :
         {std::pair{0, OffloadDevice::kNone}, std::pair{3, OffloadDevice::kNone}, std::pair{3, OffloadDevice::kCpu}}) {
      EngineConfig cfg;
      cfg.stage = stage;
      cfg.optimizer.type = kind == 2 ? optim::OptimizerType::kSgd : optim::OptimizerType::kAdamW;
      cfg.optimizer.adam_w_mode = kind != 1;
      cfg.optimizer.momentum = 0.9;
      cfg.optimizer.weight_decay = 0.05;
      cfg.offload_optimizer.device = optimizer;
      auto want = Train(cfg, host_, 4, true);
      auto got = Train(cfg, *cuda_, 4, true);
      auto plain = Train(cfg, host_, 4, false);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(plain.ok()) << plain.status();
      EXPECT_EQ(*want, *got) << "kind " << kind << " stage " << stage << " optimizer offload " << int(optimizer);
      EXPECT_NE(*want, *plain) << "the groups changed nothing";
    }
  }
}

TEST_F(EngineOnCuda, UnsupportedPlacementsAreNamed) {
  auto group = comm::CreateInProcessGroup(1, comm::Options{});
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.offload_param.device = OffloadDevice::kCpu;  // without offload_optimizer
  auto e = Engine::Create(cfg, *group[0], *cuda_);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(e.status().message()), ::testing::HasSubstr("offload_param on a CUDA device needs "
                                                                      "offload_optimizer"));
  cfg = EngineConfig{};
  cfg.stage = 1;
  cfg.offload_optimizer.device = OffloadDevice::kCpu;
  e = Engine::Create(cfg, *group[0], *cuda_);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(e.status().message()), ::testing::HasSubstr("needs stage 2 or 3"));
}

}  // namespace
}  // namespace strata::engine
