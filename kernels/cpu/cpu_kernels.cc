// Run-time selection of the host kernel table (see cpu_kernels.h).
#include "kernels/cpu/cpu_kernels.h"

namespace strata::kernels::cpu {

const CpuKernels* GetCpuKernels(Isa isa) {
  if (!IsaSupported(isa)) return nullptr;
  switch (isa) {
    case Isa::kScalar:
      return &ScalarKernels();
    case Isa::kAvx2:
      return &Avx2Kernels();
    case Isa::kAvx512:
      return &Avx512Kernels();
    case Isa::kAvx512Bf16:
      return &Avx512Bf16Kernels();
  }
  return nullptr;
}

const CpuKernels& BestCpuKernels() {
  static const CpuKernels* const best = GetCpuKernels(BestIsa());  // BestIsa is always supported
  return *best;
}

}  // namespace strata::kernels::cpu
