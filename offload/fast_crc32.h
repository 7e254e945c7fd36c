// CRC-32 (the IEEE polynomial of runtime/base/crc32.h, same values) fast enough for the NVMe data path.
//
// Why not strata::Crc32: its table loop runs at about 1.3 GB/s here, slower than the disk, and the
// store checksums every extent it writes and reads. FastCrc32 folds 64 bytes per step with carry-less
// multiplication (PCLMULQDQ, the Intel "Fast CRC computation using PCLMULQDQ" method as in zlib-chromium),
// chosen at run time when the CPU has PCLMULQDQ and SSE4.1, and falls back to strata::Crc32 otherwise.
// Results are identical to strata::Crc32, including the incremental form.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::offload {

uint32_t FastCrc32(const void* data, size_t n, uint32_t crc = 0);

// Which implementation FastCrc32 uses on this CPU: "pclmul" or "table".
const char* FastCrc32Implementation();

namespace internal {
// The folding kernel: `n` a multiple of 16 and at least 64; `crc` and the result are pre/post-inverted
// by the caller (zlib convention). Compiled with -msse4.1 -mpclmul in its own file.
uint32_t Crc32FoldPclmul(const unsigned char* data, size_t n, uint32_t crc);
}  // namespace internal

}  // namespace strata::offload
