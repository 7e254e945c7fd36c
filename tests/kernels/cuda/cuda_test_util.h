// Shared helpers of the CUDA kernel tests: the fixture that skips (with the reason) when no GPU is
// visible, a checked-call assertion, and a device copy of a host vector.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace strata::kernels::cuda::testing {

#define ASSERT_CUDA(call)                                                                    \
  do {                                                                                       \
    const cudaError_t strata_err_ = (call);                                                  \
    ASSERT_EQ(strata_err_, cudaSuccess) << #call << ": " << cudaGetErrorString(strata_err_); \
  } while (0)

// Asserts each of a list of ok flags (device allocations and copies).
#define ASSERT_ALL_OK(...)                                                                    \
  do {                                                                                        \
    for (bool strata_ok_ : {__VA_ARGS__}) ASSERT_TRUE(strata_ok_) << "cudaMalloc/cudaMemcpy"; \
  } while (0)

// Skips every test of a suite derived from it when no CUDA device is visible.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device visible (" << (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) << ")";
    }
  }
};

// Device copy of a host vector with `pad` spare elements in front (to shift alignment); freed on scope exit.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& host, size_t pad = 0) : n_(host.size()), pad_(pad) {
    ok_ = cudaMalloc(&base_, (n_ + pad_ + 1) * sizeof(T)) == cudaSuccess &&
          cudaMemcpy(base_ + pad_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(base_); }
  T* get() { return base_ + pad_; }
  bool ok() const { return ok_; }
  std::vector<T> Host() {
    std::vector<T> out(n_);
    if (cudaMemcpy(out.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
    return out;
  }

 private:
  size_t n_, pad_;
  T* base_ = nullptr;
  bool ok_ = false;
};

}  // namespace strata::kernels::cuda::testing
