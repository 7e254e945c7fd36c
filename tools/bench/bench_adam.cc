// `strata bench adam` (see bench_adam.h).
//
// What is measured: optim::ApplyUpdate (the engine's host path: fused AdamW with the param copy) over one
// segment of `elems` fp32 elements, and a STREAM triad a[i] = b[i] + s*c[i] over `elems` floats per array,
// alternating rep by rep so both see the same machine conditions. Both run on the same HostExecutor
// (same threads, same pinning: the calling thread on the first allowed CPU, workers on the next ones,
// same dynamic tiling). Rates are the best rep (as STREAM reports); medians are printed too.
// Bytes are counted as STREAM counts them: each array element read or written once, write-allocate
// traffic not counted: AdamW 16 read + 12 written + 2 (bf16/fp16 copy) = 30 bytes per parameter,
// the triad 12 bytes per element.
#include "tools/bench/bench_adam.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/optimizer.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;
namespace kc = ::strata::kernels::cpu;

struct Args {
  int threads = 1;
  size_t elems = size_t{1} << 24;
  std::string isa;
  std::string copy = "bf16";
  int reps = 10;
  bool json = false;
};

bool ParseArgs(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has_value = i + 1 < argc;
    if (f == "--json") {
      a->json = true;
    } else if (f == "--threads" && has_value) {
      a->threads = std::atoi(argv[++i]);
    } else if (f == "--elems" && has_value) {
      a->elems = std::strtoull(argv[++i], nullptr, 10);
    } else if (f == "--reps" && has_value) {
      a->reps = std::atoi(argv[++i]);
    } else if (f == "--isa" && has_value) {
      a->isa = argv[++i];
    } else if (f == "--copy" && has_value) {
      a->copy = argv[++i];
    } else {
      *err = "unknown or incomplete flag '" + f + "'";
      return false;
    }
  }
  if (a->elems == 0 || a->reps < 1) *err = "--elems and --reps must be positive";
  if (a->copy != "bf16" && a->copy != "fp16" && a->copy != "none") *err = "--copy must be bf16, fp16 or none";
  return err->empty();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <class T>
Buffer<T> Alloc(size_t n) {
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

constexpr size_t kTile = 65536;

// body(begin, end) over [0, n) in tiles, on the executor's pool (or the caller alone).
template <class Body>
void ForTiles(optim::HostExecutor& e, size_t n, Body body) {
  const size_t tiles = (n + kTile - 1) / kTile;
  auto task = [&](size_t t, int) { body(t * kTile, std::min(n, (t + 1) * kTile)); };
  if (e.pool() != nullptr) {
    e.pool()->ParallelFor(tiles, task);
  } else {
    for (size_t t = 0; t < tiles; ++t) task(t, 0);
  }
}

// First touch by the same threads and tiles that later use the memory.
void Fill(optim::HostExecutor& e, float* x, size_t n, float scale, float offset) {
  ForTiles(e, n, [=](size_t b, size_t end) {
    for (size_t i = b; i < end; ++i) {
      const uint32_t hash = static_cast<uint32_t>(i * 2654435761u) >> 8;  // 24 bits, uniform enough
      x[i] = scale * static_cast<float>(hash) * 0x1p-24f + offset;
    }
  });
}

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Stats {
  double best = 1e300;
  std::vector<double> all;
  void Add(double s) {
    best = std::min(best, s);
    all.push_back(s);
  }
  double Median() {
    std::sort(all.begin(), all.end());
    return all[all.size() / 2];
  }
};

struct Measurement {
  Stats adam, triad;
  size_t bytes_per_param = 0;
};

Measurement Measure(optim::HostExecutor& e, const Args& a) {
  const size_t n = a.elems;
  Buffer<float> master = Alloc<float>(n), grad = Alloc<float>(n), m = Alloc<float>(n), v = Alloc<float>(n);
  Buffer<float> ta = Alloc<float>(n), tb = Alloc<float>(n), tc = Alloc<float>(n);
  Buffer<uint16_t> copy = Alloc<uint16_t>(n);
  Fill(e, master.get(), n, 2.0f, -1.0f);
  Fill(e, grad.get(), n, 0.2f, -0.1f);
  Fill(e, m.get(), n, 0.0f, 0.0f);
  Fill(e, v.get(), n, 0.0f, 0.0f);
  Fill(e, ta.get(), n, 0.0f, 0.0f);
  Fill(e, tb.get(), n, 1.0f, 0.0f);
  Fill(e, tc.get(), n, 1.0f, 0.5f);
  ForTiles(e, n, [&](size_t b, size_t end) { std::memset(copy.get() + b, 0, (end - b) * sizeof(uint16_t)); });

  optim::OptimizerConfig cfg;
  cfg.weight_decay = 0.01;
  const std::vector<shard::Segment> segs = {{0, n, 0, true}};
  optim::UpdateOptions opts;
  opts.executor = &e;
  if (a.copy != "none") {
    opts.param_copy = copy.get();
    opts.param_copy_dtype = a.copy == "bf16" ? DType::kBF16 : DType::kF16;
  }
  const optim::ShardState state{master.get(), grad.get(), m.get(), v.get()};
  float* A = ta.get();
  const float *B = tb.get(), *C = tc.get();
  Measurement r;
  r.bytes_per_param = 28 + (a.copy == "none" ? 0 : 2);
  for (int rep = 0; rep <= a.reps; ++rep) {  // rep 0 warms up and is not counted
    auto t0 = Clock::now();
    ForTiles(e, n, [=](size_t b, size_t end) {
      for (size_t i = b; i < end; ++i) A[i] = B[i] + 3.0f * C[i];
    });
    const double triad_s = Seconds(t0);
    t0 = Clock::now();
    optim::ApplyUpdate(cfg, state, segs, 1e-3, rep + 1, 0.5f, opts);
    const double adam_s = Seconds(t0);
    if (rep > 0) {
      r.triad.Add(triad_s);
      r.adam.Add(adam_s);
    }
  }
  return r;
}

void Report(const Args& a, optim::HostExecutor& e, bool pinned, Measurement& r) {
  const double n = static_cast<double>(a.elems);
  const double params_per_s = n / r.adam.best, triad_bps = 12.0 * n / r.triad.best;
  const double ratio = params_per_s * static_cast<double>(r.bytes_per_param) / triad_bps;
  const double adam_med = r.adam.Median(), triad_med = r.triad.Median();
  if (!a.json) {
    std::printf("adamw %s threads=%d elems=%zu copy=%s: %.3g params/s x %zu B = %.2f GB/s; triad %.2f GB/s; "
                "ratio %.3f (medians: %.2f vs %.2f GB/s)\n",
                e.isa_name(), e.threads(), a.elems, a.copy.c_str(), params_per_s, r.bytes_per_param,
                params_per_s * static_cast<double>(r.bytes_per_param) / 1e9, triad_bps / 1e9, ratio,
                n * static_cast<double>(r.bytes_per_param) / adam_med / 1e9, 12.0 * n / triad_med / 1e9);
    return;
  }
  nlohmann::json j = {
      {"op", "adamw"}, {"isa", e.isa_name()}, {"threads", e.threads()}, {"pinned", pinned},
      {"elems", a.elems}, {"param_copy", a.copy}, {"reps", a.reps},
      {"params_per_s", params_per_s}, {"params_per_s_median", n / adam_med},
      {"bytes_per_param", r.bytes_per_param},
      {"adam_bytes_per_s", params_per_s * static_cast<double>(r.bytes_per_param)},
      {"triad_bytes_per_s", triad_bps}, {"triad_bytes_per_s_median", 12.0 * n / triad_med},
      {"triad_bytes_per_elem", 12}, {"ratio_to_triad", ratio},
      {"adam_seconds_best", r.adam.best}, {"triad_seconds_best", r.triad.best}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

std::string BenchAdamUsage() {
  return "usage: strata bench adam [--threads T] [--elems N] [--isa NAME] [--copy bf16|fp16|none] [--reps R] [--json]\n"
         "  host AdamW throughput over N elements on T threads, against a STREAM-style triad measured in the same\n"
         "  run; --isa forces scalar|avx2|avx512|avx512bf16, --copy the rounded parameter copy the step also writes\n";
}

int RunBenchAdam(int argc, char** argv) {
  Args a;
  std::string err;
  if (!ParseArgs(argc, argv, &a, &err)) {
    std::fprintf(stderr, "bench adam: %s\n%s", err.c_str(), BenchAdamUsage().c_str());
    return 2;
  }
  auto exec = optim::HostExecutor::Create(a.threads, a.isa);
  if (!exec.ok()) {
    std::fprintf(stderr, "bench adam: %s\n", std::string(exec.status().message()).c_str());
    return 2;
  }
  const std::vector<int> cpus = kc::AllowedCpus();
  bool pinned = !cpus.empty() && kc::PinCurrentThread(cpus[0]);
  if ((*exec)->pool() != nullptr) pinned = pinned && (*exec)->pool()->pinned();
  Measurement r = Measure(**exec, a);
  Report(a, **exec, pinned, r);
  return 0;
}

}  // namespace strata::tools
