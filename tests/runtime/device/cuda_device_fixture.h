// A gtest fixture holding CUDA device 0; skips the test, with the reason, where no GPU is visible.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "runtime/device/cuda_device.h"

namespace strata::device::testing {

class CudaDeviceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto d = CudaDevice::Create(0);
    ASSERT_TRUE(d.ok()) << d.status();
    cuda_ = std::move(d).value();
  }
  std::unique_ptr<CudaDevice> cuda_;
};

}  // namespace strata::device::testing
