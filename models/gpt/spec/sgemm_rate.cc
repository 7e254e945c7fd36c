// The host rate of the GPT's own product (gpt_spec.h): the model's HostProductGflops.
#include <chrono>
#include <vector>

#include "models/gpt/nn/cpu/nn.h"
#include "models/gpt/spec/gpt_spec.h"

namespace strata::gpt {

double SgemmGflops(int M, int K, int N, double seconds) {
  using Clock = std::chrono::steady_clock;
  std::vector<float> a(size_t(M) * K, 0.5f), w(size_t(K) * N, 0.25f), out(size_t(M) * N);
  kernels::cpu::MatmulForward(a.data(), w.data(), nullptr, out.data(), M, K, N);  // warm
  int reps = 0;
  const auto t0 = Clock::now();
  double secs = 0;
  while (secs < seconds) {
    kernels::cpu::MatmulForward(a.data(), w.data(), nullptr, out.data(), M, K, N);
    ++reps;
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return 2.0 * M * K * N * reps / secs / 1e9;
}

}  // namespace strata::gpt
