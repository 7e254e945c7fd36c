// The PCLMULQDQ folding kernel of Crc32 (crc32.h). This file alone is compiled with -msse4.1 -mpclmul
// (on x86; elsewhere it compiles to a stub that is never called); it runs only after the run-time CPU
// check in crc32.cc (internal::Crc32HavePclmul).
//
// Method: Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (2009),
// bit-reflected CRC-32 constants as in zlib-chromium's crc32_simd.c: fold four 128-bit lanes over
// 64-byte blocks, fold the lanes into one, fold 16-byte blocks, reduce 128 -> 64 -> 32 bits (Barrett).
#include "runtime/base/crc32_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace strata::internal {

uint32_t Crc32FoldPclmul(const unsigned char* buf, size_t len, uint32_t crc) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};
  auto load = [](const unsigned char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  auto fold = [](__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), _mm_clmulepi64_si128(x, k, 0x00)), next);
  };

  __m128i x1 = _mm_xor_si128(load(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(buf + 16), x3 = load(buf + 32), x4 = load(buf + 48);
  buf += 64;
  len -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  while (len >= 64) {  // four lanes in parallel
    x1 = fold(x1, k, load(buf));
    x2 = fold(x2, k, load(buf + 16));
    x3 = fold(x3, k, load(buf + 32));
    x4 = fold(x4, k, load(buf + 48));
    buf += 64;
    len -= 64;
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  while (len >= 16) {
    x1 = fold(x1, k, load(buf));
    buf += 16;
    len -= 16;
  }
  // 128 -> 64 bits.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2b = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2b);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2b = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x00), x2b);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2b = _mm_and_si128(x1, mask32);
  x2b = _mm_clmulepi64_si128(x2b, k, 0x10);
  x2b = _mm_and_si128(x2b, mask32);
  x2b = _mm_clmulepi64_si128(x2b, k, 0x00);
  x1 = _mm_xor_si128(x1, x2b);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

}  // namespace strata::internal

#else  // not x86: Crc32HavePclmul() is false, so this is never called.

namespace strata::internal {
uint32_t Crc32FoldPclmul(const unsigned char*, size_t, uint32_t crc) { return crc; }
}  // namespace strata::internal

#endif
