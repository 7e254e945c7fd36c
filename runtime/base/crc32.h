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

// Splicing CRCs without the bytes (zlib's crc32_combine, and its inverse), for a checkpoint writer that knows a
// tile's CRC from the NVMe store and reads only the pieces it must (Note [Cloned checkpoint lanes] in
// checkpoint/files.h). In GF(2)[x] modulo the polynomial, Crc32 of a followed by b is crc(a) * x^(8 |b|) + crc(b);
// x is invertible there (the polynomial's constant term is 1), so a piece's CRC follows from the whole's and the
// others'.
//
// The CRC-32 of a followed by b, from their CRCs and b's length in bytes.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
// The CRC-32 of the middle of `before` + `middle` + `after`, from the CRC of the whole and of the other two
// (either may be empty: CRC 0, length 0): Crc32Combine(Crc32Combine(before, m, middle_len), after, after_len) ==
// whole for m, the result.
uint32_t Crc32Middle(uint32_t whole, uint32_t before, uint32_t after, uint64_t middle_len, uint64_t after_len);

// Which implementation Crc32 uses for long inputs on this CPU: "pclmul" or "table".
const char* Crc32Implementation();

}  // namespace strata
