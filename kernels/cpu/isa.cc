// CPU feature detection for the kernel variants (see isa.h).
#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <cstring>

namespace strata::kernels::cpu {
namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for __builtin_cpu_supports, and the
// fuzz build (tests/fuzz) compiles this file with clang 14.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "unknown";
}

bool ParseIsa(const char* name, Isa* out) {
  if (name == nullptr) return false;
  for (int i = 0; i < kIsaCount; ++i) {
    if (std::strcmp(name, IsaName(static_cast<Isa>(i))) == 0) {
      *out = static_cast<Isa>(i);
      return true;
    }
  }
  return false;
}

bool IsaSupported(Isa isa) {
  __builtin_cpu_init();
  // The flags each variant's file is compiled with (kernels/CMakeLists.txt) must all be checked here.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

Isa BestIsa() {
  for (int i = kIsaCount - 1; i > 0; --i) {
    if (IsaSupported(static_cast<Isa>(i))) return static_cast<Isa>(i);
  }
  return Isa::kScalar;
}

}  // namespace strata::kernels::cpu
