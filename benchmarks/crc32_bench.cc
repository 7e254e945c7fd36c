// Google Benchmark for runtime/base/crc32: the dispatched Crc32 (PCLMULQDQ folding where the CPU has it)
// and the slicing-by-4 table alone (its fallback and the pre-merge checkpoint CRC), on a buffer inside
// the caches (64 KiB) and one far beyond them (64 MiB). Each reports ratio_to_read = its bytes/s over
// that of a plain read of the same buffer (a sum of 64-bit words) measured in the same run, so the
// number survives a noisy machine. Run: build/release/bin/strata_crc32_bench [--benchmark_min_time=0.2].
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/base/crc32.h"
#include "runtime/base/crc32_internal.h"

namespace strata {
namespace {

std::vector<unsigned char> Buffer(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  return v;
}

// Best-of-11 read of `v` as 64-bit words, in bytes/s: the ceiling a CRC over the same bytes could reach.
double ReadBytesPerSecond(const std::vector<unsigned char>& v) {
  double best = 1e300;
  for (int rep = 0; rep < 11; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t sum = 0;
    for (size_t i = 0; i + 8 <= v.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, v.data() + i, 8);
      sum += w;
    }
    benchmark::DoNotOptimize(sum);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(v.size()) / best;
}

template <uint32_t (*Fn)(const void*, size_t, uint32_t)>
void Run(benchmark::State& state, const char* label) {
  const auto v = Buffer(static_cast<size_t>(state.range(0)));
  const double read = ReadBytesPerSecond(v);
  for (auto _ : state) benchmark::DoNotOptimize(Fn(v.data(), v.size(), 0));
  const double bytes = static_cast<double>(v.size()) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.SetLabel(label);
  state.counters["read_bytes_per_s"] = read;
  state.counters["ratio_to_read"] = benchmark::Counter(bytes / read, benchmark::Counter::kIsRate);
}

void BM_Crc32(benchmark::State& state) { Run<Crc32>(state, Crc32Implementation()); }
void BM_Crc32Table(benchmark::State& state) { Run<internal::Crc32Table>(state, "table"); }

BENCHMARK(BM_Crc32)->Arg(64 << 10)->Arg(64 << 20)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Crc32Table)->Arg(64 << 10)->Arg(64 << 20)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
