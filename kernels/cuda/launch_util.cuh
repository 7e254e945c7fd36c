// Shared launch and memory-access helpers of the CUDA kernels (kernels/cuda). Not an op.
//
// Vector access: an op works on 8 elements at a time so that every load and store is 16 bytes (two
// float4 for fp32 arrays, one uint4 for the 16-bit param copy). That needs every array aligned to the
// same element phase; VectorSplit finds the scalar head that reaches it, or reports that the arrays are
// mutually misaligned (then the op runs element by element, still grid-stride, still correct).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cuda {

inline constexpr int kBlockThreads = 256;
inline constexpr unsigned kMaxBlocks = 2048;  // grid-stride beyond this (a few waves on an H100)
inline constexpr int kVec = 8;                // elements per vector step

// ceil(items / per_block): blocks that cover `items` with `per_block` each (no cap; 0 for none).
constexpr unsigned BlocksFor(size_t items, size_t per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

// Blocks for `work` grid-stride items: enough to cover them, at most kMaxBlocks, at least 1.
inline unsigned GridFor(size_t work) {
  const size_t blocks = (work + kBlockThreads - 1) / kBlockThreads;
  return blocks == 0 ? 1u : (blocks > kMaxBlocks ? kMaxBlocks : static_cast<unsigned>(blocks));
}

// Row kernels (one block a row, threads along the row): blocks for `rows` rows, one each up to
// kMaxRowBlocks, grid-stride over rows beyond. 0 for no rows (the caller launches nothing).
inline constexpr unsigned kMaxRowBlocks = 65535;
inline unsigned GridForRows(size_t rows) {
  return rows < kMaxRowBlocks ? static_cast<unsigned>(rows) : kMaxRowBlocks;
}

// [0, head) scalar, then vecs steps of kVec elements, then the scalar rest up to n.
struct VectorSplit {
  size_t head = 0;
  size_t vecs = 0;
};

// The element phase (index mod kVec) at which `p` (elements of `elem_bytes`) is 16-byte aligned, or -1
// when no element index is (the address is not a multiple of the element size).
inline int AlignedPhase(const void* p, size_t elem_bytes) {
  if (p == nullptr) return -2;  // absent array: no constraint
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % elem_bytes != 0) return -1;
  const size_t per16 = 16 / elem_bytes;  // elements per 16 bytes (4 for fp32, 8 for 16-bit)
  const size_t misalign = (a % 16) / elem_bytes;
  return static_cast<int>((per16 - misalign) % per16);
}

// Combines phases (fp32 arrays have period 4, 16-bit ones period 8) into one head < kVec, or false.
inline bool CommonHead(const int* phases, const size_t* periods, int count, size_t* head) {
  for (size_t h = 0; h < static_cast<size_t>(kVec); ++h) {
    bool ok = true;
    for (int i = 0; i < count && ok; ++i) {
      if (phases[i] == -2) continue;
      ok = phases[i] >= 0 && h % periods[i] == static_cast<size_t>(phases[i]);
    }
    if (ok) {
      *head = h;
      return true;
    }
  }
  return false;
}

inline VectorSplit SplitFor(size_t n, bool vectorizable, size_t head) {
  VectorSplit s;
  if (!vectorizable || head >= n) {
    s.head = n;
    return s;
  }
  s.head = head;
  s.vecs = (n - head) / kVec;
  return s;
}

// 8 floats at p (16-byte aligned) as two float4.
struct Float8 {
  float v[kVec];
};
__device__ __forceinline__ Float8 Load8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return Float8{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}
__device__ __forceinline__ void Store8(float* p, const Float8& x) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x.v[4], x.v[5], x.v[6], x.v[7]);
}
// 8 16-bit values to p (16-byte aligned) as one uint4.
__device__ __forceinline__ void Store8(uint16_t* p, const uint16_t (&h)[kVec]) {
  uint4 u;
  u.x = h[0] | (static_cast<uint32_t>(h[1]) << 16);
  u.y = h[2] | (static_cast<uint32_t>(h[3]) << 16);
  u.z = h[4] | (static_cast<uint32_t>(h[5]) << 16);
  u.w = h[6] | (static_cast<uint32_t>(h[7]) << 16);
  *reinterpret_cast<uint4*>(p) = u;
}

}  // namespace strata::kernels::cuda
