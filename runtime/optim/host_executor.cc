// HostExecutor: resolves the kernel variant (with errors that name it) and owns the pool (see
// host_executor.h).
#include "runtime/optim/host_executor.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/tensor_ops.h"

namespace strata::optim {

namespace kc = ::strata::kernels::cpu;

absl::StatusOr<const kc::CpuKernels*> HostExecutor::ResolveKernels(absl::string_view isa) {
  kc::Isa chosen = kc::BestIsa();
  if (!isa.empty() && !kc::ParseIsa(std::string(isa).c_str(), &chosen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown CPU kernel variant '", isa, "' (expected scalar, avx2, avx512 or avx512bf16)"));
  }
  const kc::CpuKernels* k = kc::GetCpuKernels(chosen);
  if (k == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("this CPU cannot run the ", kc::IsaName(chosen),
                                                      " kernels; the widest it supports is ",
                                                      kc::IsaName(kc::BestIsa())));
  }
  return k;
}

absl::StatusOr<std::unique_ptr<HostExecutor>> HostExecutor::Create(int threads, absl::string_view isa,
                                                                  std::vector<int> cpus) {
  if (threads < 1 || threads > kc::ThreadPool::kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("host optimizer threads must be in [1, ", kc::ThreadPool::kMaxThreads, "], got ", threads));
  }
  auto k = ResolveKernels(isa);
  if (!k.ok()) return k.status();
  std::unique_ptr<kc::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<kc::ThreadPool>(kc::ThreadPool::Options{threads, std::move(cpus)});
  return std::unique_ptr<HostExecutor>(new HostExecutor(*k, std::move(pool)));
}

double HostExecutor::SumSquares(const float* x, size_t n) { return kc::SumSquares(*kernels_, pool(), x, n); }

size_t HostExecutor::CountNonFinite(const float* x, size_t n) {
  return kc::CountNonFinite(*kernels_, pool(), x, n);
}

void HostExecutor::Scale(float* x, size_t n, float s) { kc::Scale(*kernels_, pool(), x, x, n, s); }

void HostExecutor::CastToBf16(const float* x, uint16_t* y, size_t n) { kc::CastToBf16(*kernels_, pool(), x, y, n); }

void HostExecutor::CastToHalf(const float* x, uint16_t* y, size_t n) { kc::CastToHalf(*kernels_, pool(), x, y, n); }

}  // namespace strata::optim
