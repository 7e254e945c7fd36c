// The host kernel table: one set of single-threaded range functions per ISA variant, chosen at run time.
//
// Guarantees:
//  - Every variant's optimizer and cast results are bit-identical to the scalar reference (the same
//    element templates of kernels/common/element_math.h, Note [One operation order]).
//  - sum_squares follows Note [Sum of squares order] in every variant, so it is bit-identical too.
//  - No function allocates, blocks or reads the environment; callers own every buffer. Buffers need no
//    alignment. Ranges of different calls may run concurrently when they do not overlap.
// Multi-threaded, segment-aware entry points are in optimizer_ops.h and tensor_ops.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/element_math.h"
#include "kernels/common/optimizer_arrays.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu {

using ::strata::kernels::OptimizerArrays;  // kernels/common/optimizer_arrays.h
using ::strata::kernels::ParamCopy;

// Note [Sum of squares order]
// A sum of squares is defined, for every variant, in this order: element i of a call goes to lane
// i mod 32; each lane adds double(x)*double(x) in index order starting from +0.0 (the square of a float is
// exact in double, so a fused multiply-add gives the same bits as multiply then add); then the lanes are
// folded, for w = 16, 8, 4, 2, 1: lane[k] += lane[k + w] (k < w); the result is lane[0]. tensor_ops.h
// applies this per tile and sums tiles in a fixed order, so totals do not depend on ISA or thread count.
inline constexpr int kSumLanes = 32;

// Note [Streaming stores]
// The vector variants write 16-bit outputs (the optimizer's param copy, the casts) with non-temporal
// stores in the body of a range: the output is write-only, so a normal store would first read each line
// (read-for-ownership, 2 extra bytes of traffic per element) and fill the caches with data the next phase
// (gather, device copy) reads from memory anyway. Measured: +13% AdamW rate on one thread
// (docs/perf-notes.md "Host AdamW"). The range ends with sfence, so the data are globally visible before
// the range returns. fp32 state (master, m, v) is updated in place and keeps normal stores.

struct CpuKernels {
  Isa isa;
  // Elements [begin, end): g = grad[i] * grad_scale, then AdamWUpdate (element_math.h); writes master,
  // m, v and the param copy.
  void (*adamw)(const OptimizerArrays& a, size_t begin, size_t end, const AdamWCoeffs<float>& c,
                float grad_scale);
  // Elements [begin, end): g = grad[i] * grad_scale, then SgdUpdate with momentum buffer `m`.
  void (*sgd)(const OptimizerArrays& a, size_t begin, size_t end, const SgdStep& c, float grad_scale);
  // y[i] = FloatToBf16(x[i]) / FloatToHalf(x[i]) for i < n.
  void (*cast_bf16)(const float* x, uint16_t* y, size_t n);
  void (*cast_f16)(const float* x, uint16_t* y, size_t n);
  // y[i] = x[i] * s for i < n; y == x is allowed (in place), other overlaps are not.
  void (*scale)(const float* x, float* y, size_t n, float s);
  // y[i] += x[i] for i < n (one correctly rounded fp32 add per element: every variant gives the same bits).
  // x and y must not overlap.
  void (*accumulate)(const float* x, float* y, size_t n);
  // Note [Sum of squares order] over x[0..n).
  double (*sum_squares)(const float* x, size_t n);
  // Number of elements of x[0..n) that are Inf or NaN.
  size_t (*count_non_finite)(const float* x, size_t n);
};

// The table of `isa`, or nullptr when this CPU cannot run it (IsaSupported).
const CpuKernels* GetCpuKernels(Isa isa);
// The table of BestIsa(): what host element math uses when no executor chose one.
const CpuKernels& BestCpuKernels();

// Note [ISA translation units]
// Each variant lives in a file compiled with its own -m flags. An inline function or template
// instantiation with external linkage emitted in such a file could be chosen by the linker for callers
// everywhere (the ODR lets it assume all copies are equal) and run wide instructions on a CPU without
// them. So those files put everything in an anonymous namespace, instantiate the element templates only
// with their own (internal) vector types, call no external inline function on float, and export only
// the table accessors below, which callers reach through GetCpuKernels after checking IsaSupported.
const CpuKernels& ScalarKernels();
const CpuKernels& Avx2Kernels();
const CpuKernels& Avx512Kernels();
const CpuKernels& Avx512Bf16Kernels();

}  // namespace strata::kernels::cpu
