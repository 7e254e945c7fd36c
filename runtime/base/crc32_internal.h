// The two halves of Crc32 (crc32.h), exposed for its test and benchmark only: each is checked against a
// bitwise oracle on its own, whichever one this CPU dispatches to.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::internal {

// Slicing-by-4 table CRC-32, any length and alignment; same contract as Crc32.
uint32_t Crc32Table(const void* data, size_t n, uint32_t crc);

// True when the CPU has PCLMULQDQ and SSE4.1 (and this is an x86 build), so Crc32FoldPclmul may run.
bool Crc32HavePclmul();

// The folding kernel: `n` a multiple of 16 and at least 64; `crc` and the result are pre/post-inverted by
// the caller (zlib convention). Compiled with -msse4.1 -mpclmul in its own file (crc32_pclmul.cc); call
// only when Crc32HavePclmul().
uint32_t Crc32FoldPclmul(const unsigned char* data, size_t n, uint32_t crc);

}  // namespace strata::internal
