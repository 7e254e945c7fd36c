#include "offload/fast_crc32.h"

#include "runtime/base/crc32.h"

namespace strata::offload {
namespace {

bool HavePclmul() {
  static const bool have = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return have;
}

}  // namespace

uint32_t FastCrc32(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  if (HavePclmul() && n >= 64) {
    const size_t chunk = n & ~size_t{15};
    crc = ~internal::Crc32FoldPclmul(p, chunk, ~crc);
    p += chunk;
    n -= chunk;
  }
  return n == 0 ? crc : Crc32(p, n, crc);
}

const char* FastCrc32Implementation() { return HavePclmul() ? "pclmul" : "table"; }

}  // namespace strata::offload
