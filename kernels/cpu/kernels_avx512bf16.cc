// The AVX-512 variant with AVX512-BF16: the bf16 param copy and casts use vcvtneps2bf16 (see ToBf16 in
// avx512_impl.h for the subnormal fix-up); everything else is the kernels_avx512.cc code.
#include "kernels/cpu/avx512_impl.h"

#if !defined(__AVX512BF16__)
#error "kernels_avx512bf16.cc must be compiled with -mavx512bf16"
#endif

namespace strata::kernels::cpu {

const CpuKernels& Avx512Bf16Kernels() {
  static constexpr CpuKernels kTable = MakeAvx512Table(Isa::kAvx512Bf16);
  return kTable;
}

}  // namespace strata::kernels::cpu
