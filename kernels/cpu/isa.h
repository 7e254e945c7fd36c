// Which host vector ISA a kernel runs with, and what this CPU supports.
//
// Guarantees: IsaSupported(i) is true only when both the CPU (cpuid) and the OS (saved vector state,
// checked by libgcc's __builtin_cpu_supports) allow every instruction the variant's file was compiled
// for, so a supported variant never raises SIGILL. Nothing here reads the environment: callers pass a
// forced choice in (runtime/optim reads STRATA_CPU_ISA through runtime/base/env).
#pragma once

namespace strata::kernels::cpu {

// Ordered from the reference to the widest. kAvx512Bf16 is kAvx512 plus the AVX512-BF16 conversion
// instruction (vcvtneps2bf16) for the bf16 param copy.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
inline constexpr int kIsaCount = 4;

// "scalar", "avx2", "avx512", "avx512bf16".
const char* IsaName(Isa isa);

// Parses an IsaName; false (and *out untouched) for anything else, including "".
bool ParseIsa(const char* name, Isa* out);

// Whether this CPU and OS can run the variant (kScalar: always).
bool IsaSupported(Isa isa);

// The widest supported variant.
Isa BestIsa();

}  // namespace strata::kernels::cpu
