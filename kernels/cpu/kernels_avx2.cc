// The AVX2 variant (AVX2, FMA, F16C; compiled with those flags only, kernels/CMakeLists.txt).
//
// 8 floats per register; full blocks use plain loads and stores (streaming stores for 16-bit outputs,
// Note [Streaming stores]); a range's head and tail use vmaskmov loads and stores (masked-off lanes are
// neither read nor written), their 16-bit outputs going through a small stack buffer, so there is no
// float instantiation of the element templates here (Note [ISA translation units]).
// Results are bit-identical to the scalar variant (Note [One operation order]); FMA is used only in the
// sum of squares, where it is exact (Note [Sum of squares order]).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_kernels.h"

namespace strata::kernels::cpu {
namespace {

struct V8 {
  __m256 r;
};
inline V8 operator+(V8 a, V8 b) { return {_mm256_add_ps(a.r, b.r)}; }
inline V8 operator-(V8 a, V8 b) { return {_mm256_sub_ps(a.r, b.r)}; }
inline V8 operator*(V8 a, V8 b) { return {_mm256_mul_ps(a.r, b.r)}; }
inline V8 operator/(V8 a, V8 b) { return {_mm256_div_ps(a.r, b.r)}; }
inline V8 Sqrt(V8 a) { return {_mm256_sqrt_ps(a.r)}; }  // IEEE, correctly rounded
inline V8 Splat(float x) { return {_mm256_set1_ps(x)}; }

// Lane j is in the mask when j < n (n <= 8).
inline __m256i TailMask(size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// A block of up to 8 elements: its length and lane mask (used by kMasked accesses only).
struct Block {
  size_t n;
  __m256i mask;
};

// How a block touches memory: kMasked only the lanes of the block (a range's head and tail), kStream all
// 8 with software prefetch ahead and non-temporal stores for 16-bit outputs (Note [Streaming stores];
// the output must be 16-byte aligned: StreamHead).
enum class Mem { kMasked, kStream };
inline constexpr size_t kPrefetchElems = 512;

template <Mem kMem>
inline V8 Load(const float* p, const Block& b) {
  if constexpr (kMem == Mem::kStream) return {_mm256_loadu_ps(p)};
  return {_mm256_maskload_ps(p, b.mask)};
}
template <Mem kMem>
inline void Prefetch(const float* p) {
  if constexpr (kMem == Mem::kStream) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchElems), _MM_HINT_T0);
}
template <Mem kMem>
inline void Store(float* p, const Block& b, V8 x) {
  if constexpr (kMem == Mem::kStream) {
    _mm256_storeu_ps(p, x.r);
  } else {
    _mm256_maskstore_ps(p, b.mask, x.r);
  }
}
template <Mem kMem>
inline void Store16(uint16_t* p, const Block& b, __m128i x) {
  if constexpr (kMem == Mem::kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), x);
  } else {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), x);
    for (size_t j = 0; j < b.n; ++j) p[j] = buf[j];
  }
}

// Elements before `out` reaches a 16-byte boundary (at most `n`), done masked so the rest can stream.
inline size_t StreamHead(const uint16_t* out, size_t n) {
  const size_t head = (8 - (reinterpret_cast<uintptr_t>(out) / 2) % 8) % 8;
  return head < n ? head : n;
}

inline __m256i NanMask(V8 x) { return _mm256_castps_si256(_mm256_cmp_ps(x.r, x.r, _CMP_UNORD_Q)); }

// FloatToBf16 in integer arithmetic: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16) | 0x40; then the eight
// 32-bit results are packed to 16 bits (packus works per 128-bit lane, so fix the order with a permute).
inline __m128i ToBf16(V8 x) {
  const __m256i u = _mm256_castps_si256(x.r);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i rounded = _mm256_srli_epi32(biased, 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, NanMask(x));
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

// vcvtps2ph (F16C) rounds to nearest even with IEEE subnormals and overflow to Inf, as FloatToHalf does;
// it keeps the top NaN payload bits, which FloatToHalf drops (sign | 0x7e00): clear them on NaN lanes.
inline __m128i ToHalf(V8 x) {
  const __m128i h = _mm256_cvtps_ph(x.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan = NanMask(x);
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  return _mm_andnot_si128(_mm_and_si128(nan16, _mm_set1_epi16(0x01ff)), h);
}

template <ParamCopy kCopy, Mem kMem>
inline void StoreCopy(uint16_t* out, const Block& b, V8 p) {
  if constexpr (kCopy == ParamCopy::kBf16) Store16<kMem>(out, b, ToBf16(p));
  if constexpr (kCopy == ParamCopy::kF16) Store16<kMem>(out, b, ToHalf(p));
}

// Runs block<Mem>(i, b) over [begin, end): a masked head until `out + i` is 16-byte aligned (none
// without an output), streamed full blocks, a masked tail; then fences the streaming stores.
template <ParamCopy kCopy, class Body>
inline void ForBlocks(size_t begin, size_t end, const uint16_t* out, Body&& body) {
  size_t i = begin;
  const size_t head = kCopy == ParamCopy::kNone ? 0 : StreamHead(out + i, end - i);
  if (head > 0) body.template operator()<Mem::kMasked>(i, Block{head, TailMask(head)});
  const Block full{8, _mm256_set1_epi32(-1)};
  for (i += head; i + 8 <= end; i += 8) body.template operator()<Mem::kStream>(i, full);
  if (i < end) body.template operator()<Mem::kMasked>(i, Block{end - i, TailMask(end - i)});
  if constexpr (kCopy != ParamCopy::kNone) _mm_sfence();
}

template <ParamCopy kCopy>
void AdamWRange(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& cf, float grad_scale) {
  const AdamWCoeffs<V8> c = {Splat(cf.decay),           Splat(cf.one_minus_beta1),
                             Splat(cf.beta2),           Splat(cf.one_minus_beta2),
                             Splat(cf.bias_correction2_sqrt), Splat(cf.eps), Splat(cf.step_size), Splat(cf.l2)};
  const V8 gs = Splat(grad_scale);
  ForBlocks<kCopy>(begin, end, a.param_copy, [&]<Mem kMem>(size_t i, const Block& b) {
    Prefetch<kMem>(a.grad + i);
    Prefetch<kMem>(a.master + i);
    Prefetch<kMem>(a.m + i);
    Prefetch<kMem>(a.v + i);
    V8 p = Load<kMem>(a.master + i, b), m = Load<kMem>(a.m + i, b), v = Load<kMem>(a.v + i, b);
    AdamWUpdate(Load<kMem>(a.grad + i, b) * gs, p, m, v, c);
    Store<kMem>(a.master + i, b, p);
    Store<kMem>(a.m + i, b, m);
    Store<kMem>(a.v + i, b, v);
    StoreCopy<kCopy, kMem>(a.param_copy + i, b, p);
  });
}

template <ParamCopy kCopy>
void SgdRange(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float grad_scale) {
  const V8 lr = Splat(c.lr), mu = Splat(c.momentum), wd = Splat(c.weight_decay), gs = Splat(grad_scale);
  ForBlocks<kCopy>(begin, end, a.param_copy, [&]<Mem kMem>(size_t i, const Block& b) {
    Prefetch<kMem>(a.grad + i);
    Prefetch<kMem>(a.master + i);
    Prefetch<kMem>(a.m + i);
    V8 p = Load<kMem>(a.master + i, b), buf = Load<kMem>(a.m + i, b);
    SgdUpdate(Load<kMem>(a.grad + i, b) * gs, p, buf, lr, mu, wd);
    Store<kMem>(a.master + i, b, p);
    Store<kMem>(a.m + i, b, buf);
    StoreCopy<kCopy, kMem>(a.param_copy + i, b, p);
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
  ForBlocks<kCopy>(0, n, y, [&]<Mem kMem>(size_t i, const Block& b) {
    Prefetch<kMem>(x + i);
    StoreCopy<kCopy, kMem>(y + i, b, Load<kMem>(x + i, b));
  });
}
void CastBf16(const float* x, uint16_t* y, size_t n) { CastRange<ParamCopy::kBf16>(x, y, n); }
void CastF16(const float* x, uint16_t* y, size_t n) { CastRange<ParamCopy::kF16>(x, y, n); }

void Scale(const float* x, float* y, size_t n, float s) {
  const V8 sv = Splat(s);
  ForBlocks<ParamCopy::kNone>(0, n, nullptr, [&]<Mem kMem>(size_t i, const Block& b) {
    Store<kMem>(y + i, b, Load<kMem>(x + i, b) * sv);
  });
}

void Accumulate(const float* x, float* y, size_t n) {
  ForBlocks<ParamCopy::kNone>(0, n, nullptr, [&]<Mem kMem>(size_t i, const Block& b) {
    Store<kMem>(y + i, b, Load<kMem>(y + i, b) + Load<kMem>(x + i, b));
  });
}

// Lanes 4j..4j+3 of Note [Sum of squares order] live in acc[j]; masked-off inputs add +0.0 (no change).
double SumSquares(const float* x, size_t n) {
  __m256d acc[8];
  for (__m256d& a : acc) a = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int j = 0; j < 8; ++j) {
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * j));
      acc[j] = _mm256_fmadd_pd(d, d, acc[j]);  // d*d is exact, so one rounding either way
    }
  }
  for (int j = 0; j < 8 && i + 4 * j < n; ++j) {
    const size_t left = n - i - 4 * j;
    const __m128i lanes = _mm_set1_epi32(static_cast<int>(left > 4 ? 4 : left));
    const __m128i mask = _mm_cmpgt_epi32(lanes, _mm_setr_epi32(0, 1, 2, 3));
    const __m256d d = _mm256_cvtps_pd(_mm_maskload_ps(x + i + 4 * j, mask));
    acc[j] = _mm256_fmadd_pd(d, d, acc[j]);
  }
  for (int w = 4; w >= 1; w /= 2) {  // lane folds 16, 8, 4 (register j += register j + w)
    for (int j = 0; j < w; ++j) acc[j] = _mm256_add_pd(acc[j], acc[j + w]);
  }
  const __m128d w2 = _mm_add_pd(_mm256_castpd256_pd128(acc[0]), _mm256_extractf128_pd(acc[0], 1));
  return _mm_cvtsd_f64(w2) + _mm_cvtsd_f64(_mm_unpackhi_pd(w2, w2));
}

size_t CountNonFinite(const float* x, size_t n) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  size_t count = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const int bad = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(u, exp), exp)));
    if (bad != 0) count += static_cast<size_t>(__builtin_popcount(bad));  // rare
  }
  for (; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, x + i, sizeof(u));
    count += (u & 0x7f800000u) == 0x7f800000u ? 1 : 0;
  }
  return count;
}

constexpr CpuKernels kTable = {Isa::kAvx2, AdamW,      Sgd,        CastBf16,      CastF16,
                               Scale,      Accumulate, SumSquares, CountNonFinite};

}  // namespace

const CpuKernels& Avx2Kernels() { return kTable; }

}  // namespace strata::kernels::cpu
