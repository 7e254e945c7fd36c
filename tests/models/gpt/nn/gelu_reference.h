// GELU (tanh approximation) and its derivative in double, straight from the tanh formula: the oracle of
// the host kernel test (nn_test.cc, which checks the derivative against finite differences) and of the
// shared element math test (common/nn_math_test.cc). Independent of kernels/: no shared code.
#pragma once

#include <cmath>

namespace strata::kernels::testing {

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;

inline double RefGelu(double x) { return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }

inline double RefGeluGrad(double x) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  const double du = kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
  const double sech = 1 / std::cosh(u);
  return 0.5 * (1 + std::tanh(u)) + 0.5 * x * sech * sech * du;
}

}  // namespace strata::kernels::testing
