// The CUDA device tier's operations (memory::CreateCudaTierOps, runtime/memory/tier_ops_cuda.cc) pass the
// TierOps conformance suite (tier_ops_conformance.h) that the host tier passes in tier_ops_test.cc: device
// memory from cudaMalloc, the "On" operations on a stream of the device. Label gpu: scripts/gpu_check runs
// it; every test skips, with the reason, where no GPU is visible.
#include "runtime/memory/tier_ops_cuda.h"

#include <cuda_runtime_api.h>

#include "runtime/device/cuda_device.h"
#include "tests/runtime/memory/tier_ops_conformance.h"

namespace strata::memory::conformance {
namespace {

// Device 0, made on first use and kept for the binary's life (its streams outlive every test's ops).
device::CudaDevice* Device() {
  static device::CudaDevice* d = []() -> device::CudaDevice* {
    if (device::CudaDeviceCount() == 0) return nullptr;
    auto made = device::CudaDevice::Create(0);
    return made.ok() ? std::move(made).value().release() : nullptr;
  }();
  return d;
}

TierUnderTest Cuda() {
  TierUnderTest t;
  t.name = "cuda_device";
  t.host_visible = false;
  t.in_order_sum_squares = false;  // block partial sums (kernels/cuda/sum_squares.cuh)
  t.available = [] { return Device() != nullptr; };
  t.make_ops = []() -> std::unique_ptr<TierOps> {
    auto ops = CreateCudaTierOps(*Device());
    EXPECT_TRUE(ops.ok()) << ops.status();
    return ops.ok() ? std::move(ops).value() : nullptr;
  };
  t.allocate = [](size_t bytes) -> void* {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  };
  t.release = [](void* p) { cudaFree(p); };
  t.make_stream = []() -> std::unique_ptr<device::Stream> {
    auto s = Device()->CreateStream("tier-ops-test");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(s).value() : nullptr;
  };
  return t;
}

INSTANTIATE_TEST_SUITE_P(Cuda, TierOpsConformance, ::testing::Values(Cuda()),
                         [](const ::testing::TestParamInfo<TierUnderTest>& info) { return info.param.name; });

}  // namespace
}  // namespace strata::memory::conformance
