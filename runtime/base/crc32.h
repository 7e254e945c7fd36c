// CRC-32 (IEEE 802.3 polynomial, as zlib and PNG use), incremental: Crc32(data, n, Crc32(prev...)).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace strata
