#include "tools/doctor/doctor_measure.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "tools/bench/subprocess.h"

namespace strata::tools::doctor {
namespace {

using json = nlohmann::json;

// R products started together (a latch), each on its own thread: the mean of their rates.
double ConcurrentSgemm(const MeasureOptions& o, int threads) {
  std::vector<double> rates(threads, 0);
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (++ready == threads) cv.notify_all();
        cv.wait(lock, [&] { return ready == threads; });
      }
      rates[t] = o.sgemm(o.sgemm_m, o.sgemm_k, o.sgemm_n, o.sgemm_seconds);
    });
  }
  for (std::thread& t : pool) t.join();
  double sum = 0;
  for (double r : rates) sum += r;
  return sum / threads;
}

// The last line of `out` that is a JSON object, parsed; an error names the command.
absl::StatusOr<json> LastJson(const std::string& out, const std::string& what) {
  std::string last;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!line.empty() && line[0] == '{') last = std::string(line);
  }
  json j = json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (last.empty() || j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(what, " printed no JSON object; output: ", out.substr(0, 400)));
  }
  return j;
}

// A positive number at j[a][b] (or j[a] when b is null), else an error naming it.
absl::StatusOr<double> Positive(const json& j, const char* a, const char* b, const std::string& what) {
  const json* v = j.contains(a) ? &j[a] : nullptr;
  if (v != nullptr && b != nullptr) v = v->is_object() && v->contains(b) ? &(*v)[b] : nullptr;
  if (v == nullptr || !v->is_number() || !(v->get<double>() > 0)) {
    return absl::DataLossError(absl::StrCat(what, ": no positive ", a, b ? absl::StrCat(".", b) : "", " in its JSON"));
  }
  return v->get<double>();
}

absl::StatusOr<json> BenchComm(const MeasureOptions& o, const std::string& self, uint64_t bytes, int iters) {
  const std::vector<std::string> argv = {o.launcher, "-n", std::to_string(o.ranks), self, "bench", "comm", "--json",
                                         "--bytes", std::to_string(bytes), "--iters", std::to_string(iters)};
  auto out = RunAndCapture(argv, o.child_timeout);
  if (!out.ok()) return out.status();
  return LastJson(*out, absl::StrCat("'", o.launcher, " -n ", o.ranks, " strata bench comm'"));
}

absl::Status MeasureComm(const MeasureOptions& o, const std::string& self, HostFigures* h) {
  if (o.ranks < 2) return absl::FailedPreconditionError("one rank has no collectives (give --ranks 2 or more)");
  if (o.under_launcher) {
    return absl::FailedPreconditionError("the doctor was started by a launcher: run `strata doctor --measure` alone, "
                                         "it launches the collectives itself");
  }
  if (o.launcher.empty())
    return absl::NotFoundError("no MPI launcher (mpirun, mpiexec, srun) on PATH; give --launcher");
  STRATA_ASSIGN_OR_RETURN(const auto big, BenchComm(o, self, o.comm_bytes, o.comm_iters));
  STRATA_ASSIGN_OR_RETURN(const auto small, BenchComm(o, self, o.alpha_bytes, o.alpha_iters));
  const std::string what = "strata bench comm";
  STRATA_ASSIGN_OR_RETURN(const auto ag, Positive(big, "all_gather", "strata_busbw_gbps", what));
  STRATA_ASSIGN_OR_RETURN(const auto rs, Positive(big, "reduce_scatter", "strata_busbw_gbps", what));
  STRATA_ASSIGN_OR_RETURN(const auto ar, Positive(big, "all_reduce", "strata_busbw_gbps", what));
  STRATA_ASSIGN_OR_RETURN(const auto ag_small, Positive(small, "all_gather", "strata_busbw_gbps", what));
  STRATA_ASSIGN_OR_RETURN(const auto big_bytes, Positive(big, "bytes", nullptr, what));
  STRATA_ASSIGN_OR_RETURN(const auto small_bytes, Positive(small, "bytes", nullptr, what));
  h->allgather_gbps = ag;
  h->reduce_scatter_gbps = rs;
  h->allreduce_gbps = ar;
  h->comm_bytes = uint64_t(big_bytes);
  h->alpha_bytes = uint64_t(small_bytes);
  h->alpha_us = 1e6 * AlphaFromTwoSizes(h->alpha_bytes, ag_small, h->comm_bytes, ag, o.ranks);
  return absl::OkStatus();
}

}  // namespace

double AlphaFromTwoSizes(uint64_t small_bytes, double small_busbw, uint64_t big_bytes, double big_busbw, int p) {
  if (p < 2 || !(small_busbw > 0) || !(big_busbw > 0) || big_bytes <= small_bytes) return 0;
  const double f = double(p - 1) / p;
  const double ms = f * double(small_bytes), mb = f * double(big_bytes);
  const double ts = ms / (small_busbw * 1e9), tb = mb / (big_busbw * 1e9);
  if (!(tb > ts)) return 0;
  const double bw = (mb - ms) / (tb - ts);
  return std::max(0.0, (ts - ms / bw) / (p - 1));
}

HostFigures MeasureHost(const MeasureOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  HostFigures h;
  h.measured = true;
  h.ranks = o.ranks;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  h.omp_num_threads = omp != nullptr ? omp : "";
  h.sgemm_m = o.sgemm_m;
  h.sgemm_k = o.sgemm_k;
  h.sgemm_n = o.sgemm_n;
  h.matmul_gflops_one_rank = ConcurrentSgemm(o, 1);
  h.matmul_gflops = o.ranks == 1 ? h.matmul_gflops_one_rank : ConcurrentSgemm(o, o.ranks);
  h.launcher = o.launcher;
  auto self = SelfExecutable();
  if (!self.ok()) {
    h.update_error = h.comm_error = std::string(self.status().message());
  } else {
    auto out = RunAndCapture({*self, "bench", "adam", "--json", "--threads", "1", "--elems",
                              std::to_string(o.adam_elems)},
                             o.child_timeout);
    absl::StatusOr<json> j = out.ok() ? LastJson(*out, "strata bench adam") : absl::StatusOr<json>(out.status());
    absl::StatusOr<double> bps = j.ok() ? Positive(*j, "adam_bytes_per_s", nullptr, "strata bench adam")
                                        : absl::StatusOr<double>(j.status());
    if (bps.ok()) h.update_gbps = *bps / 1e9;
    else h.update_error = std::string(bps.status().message());
    const absl::Status comm = MeasureComm(o, *self, &h);
    if (!comm.ok()) {
      h.comm_error = std::string(comm.message());
      h.allgather_gbps = h.reduce_scatter_gbps = h.allreduce_gbps = h.alpha_us = 0;
    }
  }
  h.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return h;
}

}  // namespace strata::tools::doctor
