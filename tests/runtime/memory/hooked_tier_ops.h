// A test double of memory::TierOps: host memory (MakeHostTierOps) whose enqueued operations a test may
// replace, to count them or to inject a fault on the stream. Each hook left empty is the host tier's own.
#pragma once

#include <functional>
#include <memory>

#include "runtime/memory/tier_ops.h"

namespace strata::memory::testing {

class HookedTierOps final : public TierOps {
 public:
  using CopyHook = std::function<void(device::Stream& s, void* dst, const void* src, size_t bytes)>;
  CopyHook from_host_on, to_host_on;
  bool visible = true;

  bool host_visible() const override { return visible; }
  absl::Status ToHost(void* host, const void* src, size_t bytes) override { return host_->ToHost(host, src, bytes); }
  absl::Status FromHost(void* dst, const void* host, size_t bytes) override {
    return host_->FromHost(dst, host, bytes);
  }
  absl::Status Zero(void* p, size_t bytes) override { return host_->Zero(p, bytes); }
  void AccumulateOn(device::Stream& s, float* dst, const float* src, size_t n) override {
    host_->AccumulateOn(s, dst, src, n);
  }
  void ToHostOn(device::Stream& s, void* host, const void* src, size_t bytes) override {
    if (to_host_on) return to_host_on(s, host, src, bytes);
    host_->ToHostOn(s, host, src, bytes);
  }
  void FromHostOn(device::Stream& s, void* dst, const void* host, size_t bytes) override {
    if (from_host_on) return from_host_on(s, dst, host, bytes);
    host_->FromHostOn(s, dst, host, bytes);
  }
  absl::Status Scale(float* p, size_t n, float factor) override { return host_->Scale(p, n, factor); }
  absl::StatusOr<double> SumSquares(const float* p, size_t n) override { return host_->SumSquares(p, n); }
  absl::Status Cast(DType to, const float* src, void* dst, size_t n) override { return host_->Cast(to, src, dst, n); }

 private:
  std::unique_ptr<TierOps> host_ = MakeHostTierOps();
};

}  // namespace strata::memory::testing
