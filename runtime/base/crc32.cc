// Crc32 (crc32.h): run-time dispatch between the PCLMULQDQ folding kernel (crc32_pclmul.cc, the bulk of
// any input of 64 bytes or more) and the slicing-by-4 table (short inputs, the tail, CPUs without it).
#include "runtime/base/crc32.h"

#include <array>

#include "runtime/base/crc32_internal.h"

namespace strata {
namespace internal {
namespace {

// Slicing-by-4 tables: four bytes per step, about 4x the byte-wise loop.
std::array<std::array<uint32_t, 256>, 4> MakeTables() {
  std::array<std::array<uint32_t, 256>, 4> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 4; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

}  // namespace

uint32_t Crc32Table(const void* data, size_t n, uint32_t crc) {
  static const auto t = MakeTables();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (n >= 4) {
    crc ^= static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
    crc = t[3][crc & 0xff] ^ t[2][(crc >> 8) & 0xff] ^ t[1][(crc >> 16) & 0xff] ^ t[0][crc >> 24];
    p += 4;
    n -= 4;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

bool Crc32HavePclmul() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool have = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return have;
#else
  return false;
#endif
}

}  // namespace internal

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  if (n >= 64 && internal::Crc32HavePclmul()) {
    const size_t chunk = n & ~size_t{15};
    crc = ~internal::Crc32FoldPclmul(p, chunk, ~crc);
    p += chunk;
    n -= chunk;
  }
  return n == 0 ? crc : internal::Crc32Table(p, n, crc);
}

const char* Crc32Implementation() { return internal::Crc32HavePclmul() ? "pclmul" : "table"; }

}  // namespace strata
