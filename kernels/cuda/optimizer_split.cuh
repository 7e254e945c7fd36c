// The vector split (launch_util.cuh) of an optimizer shard: all present arrays must share one phase.
#pragma once

#include "kernels/common/optimizer_arrays.h"
#include "kernels/cuda/launch_util.cuh"

namespace strata::kernels::cuda {

// Split of elements [begin, end) of `a`, counted from `begin`.
inline VectorSplit OptimizerSplit(const OptimizerArrays& a, size_t begin, size_t end) {
  const bool copy = a.copy != ParamCopy::kNone;
  const int phases[5] = {AlignedPhase(a.master + begin, 4), AlignedPhase(a.grad + begin, 4),
                         AlignedPhase(a.m + begin, 4), a.v ? AlignedPhase(a.v + begin, 4) : -2,
                         copy ? AlignedPhase(a.param_copy + begin, 2) : -2};
  const size_t periods[5] = {4, 4, 4, 4, 8};
  size_t head = 0;
  const bool ok = CommonHead(phases, periods, 5, &head);
  return SplitFor(end - begin, ok, head);
}

}  // namespace strata::kernels::cuda
