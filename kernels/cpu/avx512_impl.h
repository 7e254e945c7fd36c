// The AVX-512 variant's body, included by kernels_avx512.cc (F, BW, VL) and kernels_avx512bf16.cc (the
// same plus AVX512-BF16, which switches the bf16 rounding to vcvtneps2bf16). Not a public header: it
// defines internal-linkage code for the including file only (Note [ISA translation units]).
//
// 16 floats per register; full blocks use plain loads and stores (and streaming stores for 16-bit
// outputs), a range's head and tail use masked ones (masked-off lanes are neither read nor written), so
// there is no scalar tail and no float instantiation of the shared element templates here. Results are
// bit-identical to the scalar variant (Note [One operation order]); the bf16 / fp16 conversions are fixed
// up where the instructions differ from element_math.h (NaN payloads, and subnormal inputs for
// vcvtneps2bf16, which flushes them).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_kernels.h"

namespace strata::kernels::cpu {
namespace {

struct V16 {
  __m512 r;
};
inline V16 operator+(V16 a, V16 b) { return {_mm512_add_ps(a.r, b.r)}; }
inline V16 operator-(V16 a, V16 b) { return {_mm512_sub_ps(a.r, b.r)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm512_mul_ps(a.r, b.r)}; }
inline V16 operator/(V16 a, V16 b) { return {_mm512_div_ps(a.r, b.r)}; }
inline V16 Sqrt(V16 a) { return {_mm512_sqrt_ps(a.r)}; }  // IEEE, correctly rounded
inline V16 Splat(float x) { return {_mm512_set1_ps(x)}; }

inline __mmask16 TailMask(size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // n < 16

// How a block of 16 elements touches memory. kMasked: only the lanes of the mask (the head and tail of
// a range). kStream: all 16 lanes, software prefetch kPrefetchElems ahead on the input streams, and the
// 16-bit output (param copy, cast result) written with non-temporal stores, which skip the
// read-for-ownership and keep the write-only output out of the caches (the output pointer must be
// 32-byte aligned: StreamHead). Note [Streaming stores] in cpu_kernels.h.
enum class Mem { kMasked, kStream };
inline constexpr size_t kPrefetchElems = 512;

template <Mem kMem>
inline V16 Load(const float* p, __mmask16 k) {
  if constexpr (kMem == Mem::kStream) return {_mm512_loadu_ps(p)};
  return {_mm512_maskz_loadu_ps(k, p)};
}
template <Mem kMem>
inline void Prefetch(const float* p) {
  if constexpr (kMem == Mem::kStream) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchElems), _MM_HINT_T0);
}
template <Mem kMem>
inline void Store(float* p, __mmask16 k, V16 x) {
  if constexpr (kMem == Mem::kStream) {
    _mm512_storeu_ps(p, x.r);
  } else {
    _mm512_mask_storeu_ps(p, k, x.r);
  }
}
template <Mem kMem>
inline void Store16(uint16_t* p, __mmask16 k, __m256i x) {
  if constexpr (kMem == Mem::kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
  } else {
    _mm256_mask_storeu_epi16(p, k, x);
  }
}

// Elements before `out` reaches a 32-byte boundary (at most `n`), done masked so the rest can stream.
inline size_t StreamHead(const uint16_t* out, size_t n) {
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(out) / 2) % 16) % 16;
  return head < n ? head : n;
}

inline __mmask16 NanMask(V16 x) { return _mm512_cmp_ps_mask(x.r, x.r, _CMP_UNORD_Q); }

// FloatToBf16 in integer arithmetic: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16) | 0x40.
inline __m256i ToBf16Exact(V16 x) {
  const __m512i u = _mm512_castps_si512(x.r);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i biased = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i rounded = _mm512_srli_epi32(biased, 16);
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, NanMask(x), quiet));
}

inline __m256i ToBf16(V16 x) {
#if defined(__AVX512BF16__)
  // vcvtneps2bf16 rounds to nearest even and quiets NaN as FloatToBf16 does, but reads subnormal inputs
  // as zero; those lanes (rare) take the exact integer path.
  const __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x.r));
  const __m512i mag = _mm512_and_si512(_mm512_castps_si512(x.r), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)),
                                                _mm512_set1_epi32(0x007fffff));
  if (sub == 0) return r;
  return _mm256_mask_mov_epi16(r, sub, ToBf16Exact(x));
#else
  return ToBf16Exact(x);
#endif
}

// vcvtps2ph rounds to nearest even with IEEE subnormals and overflow to Inf, as FloatToHalf does; it
// keeps the top NaN payload bits, which FloatToHalf drops (sign | 0x7e00): clear them on NaN lanes.
inline __m256i ToHalf(V16 x) {
  const __m256i h = _mm512_cvtps_ph(x.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i quiet = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xfe00)));
  return _mm256_mask_mov_epi16(h, NanMask(x), quiet);
}

template <ParamCopy kCopy, Mem kMem>
inline void StoreCopy(uint16_t* out, __mmask16 k, V16 p) {
  if constexpr (kCopy == ParamCopy::kBf16) Store16<kMem>(out, k, ToBf16(p));
  if constexpr (kCopy == ParamCopy::kF16) Store16<kMem>(out, k, ToHalf(p));
}

// Streaming stores are weakly ordered: fence them before the range returns (and before the pool's
// release of the task), so any thread that synchronises with this one sees them.
template <ParamCopy kCopy>
inline void FenceStreams() {
  if constexpr (kCopy != ParamCopy::kNone) _mm_sfence();
}

// Runs block<Mem>(i, mask) over [begin, end): a masked head until `out + i` is 32-byte aligned (none
// without an output), streamed full blocks, a masked tail.
template <ParamCopy kCopy, class Block>
inline void ForBlocks(size_t begin, size_t end, const uint16_t* out, Block&& block) {
  size_t i = begin;
  const size_t head = kCopy == ParamCopy::kNone ? 0 : StreamHead(out + i, end - i);
  if (head > 0) block.template operator()<Mem::kMasked>(i, TailMask(head));
  for (i += head; i + 16 <= end; i += 16) block.template operator()<Mem::kStream>(i, __mmask16{0xffff});
  if (i < end) block.template operator()<Mem::kMasked>(i, TailMask(end - i));
  FenceStreams<kCopy>();
}

template <ParamCopy kCopy>
void AdamWRange(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& cf, float grad_scale) {
  const AdamWCoeffs<V16> c = {Splat(cf.decay),           Splat(cf.one_minus_beta1),
                              Splat(cf.beta2),           Splat(cf.one_minus_beta2),
                              Splat(cf.bias_correction2_sqrt), Splat(cf.eps), Splat(cf.step_size), Splat(cf.l2)};
  const V16 gs = Splat(grad_scale);
  ForBlocks<kCopy>(begin, end, a.param_copy, [&]<Mem kMem>(size_t i, __mmask16 k) {
    Prefetch<kMem>(a.grad + i);
    Prefetch<kMem>(a.master + i);
    Prefetch<kMem>(a.m + i);
    Prefetch<kMem>(a.v + i);
    V16 p = Load<kMem>(a.master + i, k), m = Load<kMem>(a.m + i, k), v = Load<kMem>(a.v + i, k);
    AdamWUpdate(Load<kMem>(a.grad + i, k) * gs, p, m, v, c);
    Store<kMem>(a.master + i, k, p);
    Store<kMem>(a.m + i, k, m);
    Store<kMem>(a.v + i, k, v);
    StoreCopy<kCopy, kMem>(a.param_copy + i, k, p);
  });
}

template <ParamCopy kCopy>
void SgdRange(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float grad_scale) {
  const V16 lr = Splat(c.lr), mu = Splat(c.momentum), wd = Splat(c.weight_decay), gs = Splat(grad_scale);
  ForBlocks<kCopy>(begin, end, a.param_copy, [&]<Mem kMem>(size_t i, __mmask16 k) {
    Prefetch<kMem>(a.grad + i);
    Prefetch<kMem>(a.master + i);
    Prefetch<kMem>(a.m + i);
    V16 p = Load<kMem>(a.master + i, k), buf = Load<kMem>(a.m + i, k);
    SgdUpdate(Load<kMem>(a.grad + i, k) * gs, p, buf, lr, mu, wd);
    Store<kMem>(a.master + i, k, p);
    Store<kMem>(a.m + i, k, buf);
    StoreCopy<kCopy, kMem>(a.param_copy + i, k, p);
  });
}

void AdamW(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c, float gs) {
  WithParamCopy(a.copy, [&]<ParamCopy kCopy>() { AdamWRange<kCopy>(a, begin, end, c, gs); });
}

void Sgd(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float gs) {
  WithParamCopy(a.copy, [&]<ParamCopy kCopy>() { SgdRange<kCopy>(a, begin, end, c, gs); });
}

template <ParamCopy kCopy>
void CastRange(const float* x, uint16_t* y, size_t n) {
  ForBlocks<kCopy>(0, n, y, [&]<Mem kMem>(size_t i, __mmask16 k) {
    Prefetch<kMem>(x + i);
    StoreCopy<kCopy, kMem>(y + i, k, Load<kMem>(x + i, k));
  });
}
void CastBf16(const float* x, uint16_t* y, size_t n) { CastRange<ParamCopy::kBf16>(x, y, n); }
void CastF16(const float* x, uint16_t* y, size_t n) { CastRange<ParamCopy::kF16>(x, y, n); }

void Scale(const float* x, float* y, size_t n, float s) {
  const V16 sv = Splat(s);
  ForBlocks<ParamCopy::kNone>(0, n, nullptr, [&]<Mem kMem>(size_t i, __mmask16 k) {
    Store<kMem>(y + i, k, Load<kMem>(x + i, k) * sv);
  });
}

void Accumulate(const float* x, float* y, size_t n) {
  ForBlocks<ParamCopy::kNone>(0, n, nullptr, [&]<Mem kMem>(size_t i, __mmask16 k) {
    Store<kMem>(y + i, k, Load<kMem>(y + i, k) + Load<kMem>(x + i, k));
  });
}

// Lanes 8j..8j+7 of Note [Sum of squares order] live in acc[j]; masked-off inputs add +0.0 (no change).
inline void AddSquares8(const float* x, __mmask8 k, __m512d& acc) {
  const __m512d d = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x));
  acc = _mm512_fmadd_pd(d, d, acc);  // d*d is exact, so one rounding either way
}

double SumSquares(const float* x, size_t n) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int j = 0; j < 4; ++j) {
      const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8 * j));
      acc[j] = _mm512_fmadd_pd(d, d, acc[j]);
    }
  }
  for (int j = 0; j < 4 && i + 8 * j < n; ++j) {
    const size_t left = n - i - 8 * j;
    AddSquares8(x + i + 8 * j, static_cast<__mmask8>(left >= 8 ? 0xff : (1u << left) - 1u), acc[j]);
  }
  const __m512d w8 = _mm512_add_pd(_mm512_add_pd(acc[0], acc[2]), _mm512_add_pd(acc[1], acc[3]));
  const __m256d w4 = _mm256_add_pd(_mm512_castpd512_pd256(w8), _mm512_extractf64x4_pd(w8, 1));
  const __m128d w2 = _mm_add_pd(_mm256_castpd256_pd128(w4), _mm256_extractf128_pd(w4, 1));
  return _mm_cvtsd_f64(w2) + _mm_cvtsd_f64(_mm_unpackhi_pd(w2, w2));
}

inline __mmask16 NonFiniteMask(const float* x, __mmask16 k) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, x));
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp);
}

// Four registers per step with one (predictable, almost never taken) branch on their combined mask.
size_t CountNonFinite(const float* x, size_t n) {
  size_t count = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __mmask16 a = NonFiniteMask(x + i, 0xffff), b = NonFiniteMask(x + i + 16, 0xffff),
                    c = NonFiniteMask(x + i + 32, 0xffff), d = NonFiniteMask(x + i + 48, 0xffff);
    if ((a | b | c | d) != 0) {
      count += static_cast<size_t>(__builtin_popcount(_cvtmask16_u32(a)) + __builtin_popcount(_cvtmask16_u32(b)) +
                                   __builtin_popcount(_cvtmask16_u32(c)) + __builtin_popcount(_cvtmask16_u32(d)));
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16{0xffff} : TailMask(n - i);
    count += static_cast<size_t>(__builtin_popcount(_cvtmask16_u32(NonFiniteMask(x + i, k))));
  }
  return count;
}

constexpr CpuKernels MakeAvx512Table(Isa isa) {
  return CpuKernels{isa, AdamW, Sgd, CastBf16, CastF16, Scale, Accumulate, SumSquares, CountNonFinite};
}

}  // namespace
}  // namespace strata::kernels::cpu
