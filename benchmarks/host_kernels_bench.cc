// Google Benchmark targets for the host kernels (kernels/cpu), one per operation, over every variant
// this CPU has, 1 and 2 threads, and a size far beyond the caches (2^24 elements) and one inside them
// (2^15). Each benchmark first measures a STREAM triad with the same pool and reports
// ratio_to_triad = its own bytes/s (STREAM counting: each array element read or written once) over the
// triad's over the same number of elements, so the number survives a noisy machine. Run: build/bin/strata_kernels_bench
// [--benchmark_filter=AdamW] [--benchmark_min_time=0.2].
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/optimizer_ops.h"
#include "kernels/cpu/tensor_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::kernels::cpu {
namespace {

template <class T>
std::unique_ptr<T[]> Filled(size_t n, T value) {
  std::unique_ptr<T[]> p(new T[n]);
  std::fill(p.get(), p.get() + n, value);
  return p;
}

// Best-of-20 triad a = b + 3c over n floats per array on `pool`, in bytes/s (12 bytes per element).
double TriadBytesPerSecond(ThreadPool* pool, size_t n) {
  auto a = Filled<float>(n, 0.0f), b = Filled<float>(n, 1.0f), c = Filled<float>(n, 2.0f);
  constexpr size_t kTile = 65536;
  float* A = a.get();
  const float *B = b.get(), *C = c.get();
  auto task = [&](size_t t, int) {
    const size_t end = std::min(n, (t + 1) * kTile);
    for (size_t i = t * kTile; i < end; ++i) A[i] = B[i] + 3.0f * C[i];
  };
  double best = 1e300;
  for (int rep = 0; rep < 21; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool->ParallelFor((n + kTile - 1) / kTile, task);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return 12.0 * static_cast<double>(n) / best;
}

// Args: isa, threads, elems. Skips (with the reason) a variant this CPU lacks.
struct Setup {
  const CpuKernels* k;
  std::unique_ptr<ThreadPool> pool;
  size_t n;
  double triad;
};

bool MakeSetup(benchmark::State& state, Setup* s) {
  s->k = GetCpuKernels(static_cast<Isa>(state.range(0)));
  if (s->k == nullptr) {
    state.SkipWithError((std::string("CPU lacks ") + IsaName(static_cast<Isa>(state.range(0)))).c_str());
    return false;
  }
  s->pool = std::make_unique<ThreadPool>(ThreadPool::Options{static_cast<int>(state.range(1)), {}});
  s->n = static_cast<size_t>(state.range(2));
  s->triad = TriadBytesPerSecond(s->pool.get(), s->n);  // same size: cache vs cache, DRAM vs DRAM
  state.SetLabel(IsaName(s->k->isa));
  return true;
}

void Finish(benchmark::State& state, const Setup& s, double bytes_per_elem) {
  const double elems = static_cast<double>(s.n) * static_cast<double>(state.iterations());
  state.SetItemsProcessed(static_cast<int64_t>(elems));
  state.SetBytesProcessed(static_cast<int64_t>(elems * bytes_per_elem));
  state.counters["triad_bytes_per_s"] = s.triad;
  state.counters["ratio_to_triad"] =
      benchmark::Counter(elems * bytes_per_elem / s.triad, benchmark::Counter::kIsRate);  // (bytes/s) / triad
}

void BM_AdamW(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto master = Filled<float>(s.n, 0.5f), grad = Filled<float>(s.n, 0.01f), m = Filled<float>(s.n, 0.0f),
       v = Filled<float>(s.n, 0.0f);
  auto copy = Filled<uint16_t>(s.n, 0);
  const OptimizerArrays a{master.get(), grad.get(), m.get(), v.get(), copy.get(), ParamCopy::kBf16};
  const AdamWStep step = MakeAdamWStep(1e-3, 0.9, 0.999, 1e-8, 0.01, 10);
  const AdamWSegment seg{0, s.n, &step};
  for (auto _ : state) AdamWSegments(*s.k, s.pool.get(), a, &seg, 1, 0.5f);
  Finish(state, s, 30.0);  // 16 read + 12 written + 2 (bf16 copy)
}

void BM_Sgd(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto master = Filled<float>(s.n, 0.5f), grad = Filled<float>(s.n, 0.01f), m = Filled<float>(s.n, 0.0f);
  const OptimizerArrays a{master.get(), grad.get(), m.get(), nullptr, nullptr, ParamCopy::kNone};
  const SgdStep step{0.01f, 0.9f, 0.0f};
  const SgdSegment seg{0, s.n, &step};
  for (auto _ : state) SgdSegments(*s.k, s.pool.get(), a, &seg, 1, 1.0f);
  Finish(state, s, 20.0);  // 12 read + 8 written
}

void BM_CastBf16(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto x = Filled<float>(s.n, 1.1f);
  auto y = Filled<uint16_t>(s.n, 0);
  for (auto _ : state) CastToBf16(*s.k, s.pool.get(), x.get(), y.get(), s.n);
  Finish(state, s, 6.0);
}

void BM_CastF16(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto x = Filled<float>(s.n, 1.1f);
  auto y = Filled<uint16_t>(s.n, 0);
  for (auto _ : state) CastToHalf(*s.k, s.pool.get(), x.get(), y.get(), s.n);
  Finish(state, s, 6.0);
}

void BM_SumSquares(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto x = Filled<float>(s.n, 1.1f);
  for (auto _ : state) benchmark::DoNotOptimize(SumSquares(*s.k, s.pool.get(), x.get(), s.n));
  Finish(state, s, 4.0);
}

void BM_CountNonFinite(benchmark::State& state) {
  Setup s;
  if (!MakeSetup(state, &s)) return;
  auto x = Filled<float>(s.n, 1.1f);
  for (auto _ : state) benchmark::DoNotOptimize(CountNonFinite(*s.k, s.pool.get(), x.get(), s.n));
  Finish(state, s, 4.0);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"isa", "threads", "elems"});
  for (int isa = 0; isa < kIsaCount; ++isa) {
    for (int threads : {1, 2}) {
      for (int64_t elems : {int64_t{1} << 15, int64_t{1} << 24}) b->Args({isa, threads, elems});
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_AdamW)->Apply(Args);
BENCHMARK(BM_Sgd)->Apply(Args);
BENCHMARK(BM_CastBf16)->Apply(Args);
BENCHMARK(BM_CastF16)->Apply(Args);
BENCHMARK(BM_SumSquares)->Apply(Args);
BENCHMARK(BM_CountNonFinite)->Apply(Args);

}  // namespace
}  // namespace strata::kernels::cpu

BENCHMARK_MAIN();
