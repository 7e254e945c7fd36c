// CRC-32, the one implementation of the tree: checkpoint shard files and headers (runtime/checkpoint) and
// the NVMe store's extents (runtime/offload) both use it.
//
// Parameters (zlib's crc32, gzip, PNG; "CRC-32/ISO-HDLC"): reflected polynomial 0xEDB88320 (0x04C11DB7
// unreflected), init 0xFFFFFFFF, final xor 0xFFFFFFFF, so Crc32("123456789", 9) == 0xCBF43926 and
// Crc32 of nothing is 0. Incremental: Crc32(b, nb, Crc32(a, na)) == Crc32(a followed by b, na + nb).
//
// Speed: 64 bytes per step by carry-less multiplication (PCLMULQDQ folding), chosen at run time when the
// CPU has PCLMULQDQ and SSE4.1; slicing-by-4 tables otherwise and for the last < 16 bytes. The table loop
// alone runs at about 1.3 GB/s here, slower than the NVMe disk; the folding one above 10 GB/s
// (docs/perf-notes.md, "One CRC-32"). Both give identical values. Thread-safe; never fails.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);

// Which implementation Crc32 uses for long inputs on this CPU: "pclmul" or "table".
const char* Crc32Implementation();

}  // namespace strata
