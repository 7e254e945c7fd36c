// The AVX-512 (F, BW, VL) variant; compiled with those flags only (kernels/CMakeLists.txt). The body is
// avx512_impl.h; see Note [ISA translation units] for why only the accessor has external linkage.
#include "kernels/cpu/avx512_impl.h"

#if defined(__AVX512BF16__)
#error "kernels_avx512.cc must be compiled without -mavx512bf16 (it serves CPUs without it)"
#endif

namespace strata::kernels::cpu {

const CpuKernels& Avx512Kernels() {
  static constexpr CpuKernels kTable = MakeAvx512Table(Isa::kAvx512);
  return kTable;
}

}  // namespace strata::kernels::cpu
