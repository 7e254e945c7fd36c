// The host tier's operations (memory::MakeHostTierOps) pass the TierOps conformance suite
// (tier_ops_conformance.h), on a host stream, with and without a thread pool for the casts. The CUDA
// tier passes the same suite in tier_ops_cuda_test.cc (label gpu, scripts/gpu_check).
#include <cstdlib>

#include "kernels/cpu/thread_pool.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/memory/tier_ops_conformance.h"

namespace strata::memory::conformance {
namespace {

TierUnderTest Host(std::string name, const HostThreads* threads) {
  TierUnderTest t;
  t.name = std::move(name);
  t.make_ops = [threads] { return MakeHostTierOps(threads); };
  t.allocate = [](size_t bytes) { return std::malloc(bytes); };
  t.release = [](void* p) { std::free(p); };
  t.make_stream = [] { return std::make_unique<device::HostStream>("tier-ops"); };
  return t;
}

// Three threads and the scalar kernels: a cast gives the same bits on any variant and thread count.
const HostThreads* ThreePoolThreads() {
  static auto* pool = new kernels::cpu::ThreadPool(kernels::cpu::ThreadPool::Options{3, {}});
  static const HostThreads threads{&kernels::cpu::ScalarKernels(), pool};
  return &threads;
}

INSTANTIATE_TEST_SUITE_P(Host, TierOpsConformance,
                         ::testing::Values(Host("calling_thread", nullptr), Host("pool", ThreePoolThreads())),
                         [](const ::testing::TestParamInfo<TierUnderTest>& info) { return info.param.name; });

}  // namespace
}  // namespace strata::memory::conformance
