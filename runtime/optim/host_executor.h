// Where host-side optimizer and tensor work runs: one kernel variant (ISA) and a pool of pinned threads,
// owned together and passed to ApplyUpdate (optimizer.h) and the engine's host step.
//
// Guarantees: every method gives the same bits whatever the variant or thread count (the kernels are
// bit-identical to the scalar element math; SumSquares has a fixed order, kernels/cpu/tensor_ops.h).
// Methods block until done and run one at a time per executor (the pool serialises callers); callers own
// every buffer. Create() is the only allocation; the pool's workers live as long as the executor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::optim {

class HostExecutor {
 public:
  // threads >= 1 participants (the calling thread is one of them); `isa` is "" for the widest variant
  // this CPU supports, else scalar|avx2|avx512|avx512bf16 (InvalidArgument when unknown,
  // FailedPrecondition when this CPU lacks it). `cpus`: where to pin workers (kernels/cpu/thread_pool.h).
  static absl::StatusOr<std::unique_ptr<HostExecutor>> Create(int threads, absl::string_view isa,
                                                              std::vector<int> cpus = {});

  // The table for `isa` as Create() resolves it, without a pool.
  static absl::StatusOr<const kernels::cpu::CpuKernels*> ResolveKernels(absl::string_view isa);

  const kernels::cpu::CpuKernels& kernels() const { return *kernels_; }
  kernels::cpu::ThreadPool* pool() { return pool_.get(); }  // nullptr when threads == 1
  int threads() const { return pool_ ? pool_->threads() : 1; }
  const char* isa_name() const { return kernels::cpu::IsaName(kernels_->isa); }

  double SumSquares(const float* x, size_t n);
  size_t CountNonFinite(const float* x, size_t n);
  void Scale(float* x, size_t n, float s);
  void CastToBf16(const float* x, uint16_t* y, size_t n);
  void CastToHalf(const float* x, uint16_t* y, size_t n);

 private:
  HostExecutor(const kernels::cpu::CpuKernels* k, std::unique_ptr<kernels::cpu::ThreadPool> pool)
      : kernels_(k), pool_(std::move(pool)) {}

  const kernels::cpu::CpuKernels* kernels_;
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
};

}  // namespace strata::optim
