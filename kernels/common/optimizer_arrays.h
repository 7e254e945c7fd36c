// The arrays of one optimizer shard, as every back-end's optimizer kernel takes them (host: kernels/cpu,
// device: kernels/cuda). Plain data, no Abseil, compiles under nvcc.
#pragma once

#include <cstdint>

namespace strata::kernels {

// The low-precision copy an optimizer pass writes beside the fp32 master, if any.
enum class ParamCopy { kNone, kBf16, kF16 };

// Turns the run-time copy mode into the compile-time one: calls f.template operator()<kCopy>(). Shared by
// the host kernel variants (each variant's lambda keeps its own instruction set, since it is instantiated
// in its own file). The CUDA launchers switch themselves: kernels/cuda compiles as C++17, without
// templated lambdas.
template <typename F>
inline void WithParamCopy(ParamCopy copy, F&& f) {
  switch (copy) {
    case ParamCopy::kNone: return f.template operator()<ParamCopy::kNone>();
    case ParamCopy::kBf16: return f.template operator()<ParamCopy::kBf16>();
    case ParamCopy::kF16: return f.template operator()<ParamCopy::kF16>();
  }
}

// One shard's optimizer state, index-aligned: element i of every array is the same parameter element.
// SGD keeps its momentum in `m` and ignores `v`. With copy != kNone, param_copy[i] receives the updated
// master[i] rounded to nearest even (FloatToBf16 / FloatToHalf bits of element_math.h).
struct OptimizerArrays {
  float* master = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* param_copy = nullptr;
  ParamCopy copy = ParamCopy::kNone;
};

}  // namespace strata::kernels
