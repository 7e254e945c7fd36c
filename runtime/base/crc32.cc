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

namespace {
// Polynomials modulo the CRC's, reflected as the CRC keeps them: the coefficient of x^i at bit 31 - i.
constexpr uint32_t kOne = 0x80000000u;  // x^0
// x^-1: x * (x^31 + sum over i >= 1 of p_i x^(i-1)) = P(x) + 1 = 1 (mod P), with p_0 = 1.
constexpr uint32_t kXInverse = (0xedb88320u << 1) | 1u;

uint32_t MulMod(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = kOne; m != 0; m >>= 1) {
    if (a & m) p ^= b;
    b = (b & 1) ? (b >> 1) ^ 0xedb88320u : b >> 1;  // b * x
  }
  return p;
}

uint32_t PowMod(uint32_t base, uint64_t n) {
  uint32_t r = kOne;
  for (; n != 0; n >>= 1, base = MulMod(base, base)) {
    if (n & 1) r = MulMod(r, base);
  }
  return r;
}

uint32_t ShiftBytes(uint32_t crc, uint64_t bytes, bool back) {
  static const uint32_t x8 = PowMod(kOne >> 1, 8), x8_inverse = PowMod(kXInverse, 8);
  return MulMod(crc, PowMod(back ? x8_inverse : x8, bytes));
}
}  // namespace

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return ShiftBytes(crc_a, len_b, false) ^ crc_b;
}

uint32_t Crc32Middle(uint32_t whole, uint32_t before, uint32_t after, uint64_t middle_len, uint64_t after_len) {
  // whole = before * x^(8 (m + a)) + middle * x^(8 a) + after.
  const uint32_t middle_shifted = whole ^ after ^ ShiftBytes(before, middle_len + after_len, false);
  return ShiftBytes(middle_shifted, after_len, true);
}

const char* Crc32Implementation() { return internal::Crc32HavePclmul() ? "pclmul" : "table"; }

}  // namespace strata
