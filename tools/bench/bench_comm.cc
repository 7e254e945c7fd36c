// `strata bench comm [--bytes N] [--iters K] [--shm] [--json]` (under mpirun): bus bandwidth of the MPI back-end's
// all_gather, reduce_scatter and all_reduce (fp32 sum), each next to the raw blocking MPI collective on
// the same buffers in the same run. The ratio shows what the stream / Work / deadline machinery costs;
// the absolute numbers show whether the host reduce-scatter dominates a step (docs/design.md "Communication").
// Bus bandwidth: all_gather and reduce_scatter move (n-1)/n of the full buffer per rank, all_reduce 2x.
// --shm adds the shared-memory back-end (shm_communicator.h, bootstrapped over MPI) on the same buffers, and a
// floor measured in the same run: every rank copies the whole buffer at once (memcpy), the least an all-gather
// through shared memory moves per rank, expressed in the same bus bandwidth.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/shm_communicator.h"
#include "runtime/device/host_device.h"
#include "spec/flags.h"
#include "spec/launch.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  const char* op;
  double strata_gbps, mpi_gbps;
  double shm_gbps = 0;  // --shm
};

template <typename F>
absl::StatusOr<double> BestSeconds(int iters, comm::Communicator& world, device::Stream& s, F&& once) {
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    STRATA_RETURN_IF_ERROR(world.Barrier(s).Wait());
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(once());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

absl::Status Bench(comm::Communicator& world, comm::Communicator* shm, size_t bytes, int iters, bool json) {
  const int n = world.size();
  const size_t full = bytes / 4 / n * n, block = full / n;  // elements
  std::vector<float> send(full, 1.0f), recv(full), out(block);
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto s, dev.CreateStream("bench"));
  std::vector<Row> rows;
  const double moved = double(full) * 4 * (n - 1) / n;
  auto rate = [&](double secs, double factor) { return factor * moved / secs / 1e9; };
  {
    STRATA_ASSIGN_OR_RETURN(double ours, BestSeconds(iters, world, *s, [&] {
      return world.AllGather(send.data(), recv.data(), block, DType::kF32, *s).Wait();
    }));
    STRATA_ASSIGN_OR_RETURN(double raw, BestSeconds(iters, world, *s, [&] {
                              return MPI_Allgather(send.data(), int(block), MPI_FLOAT, recv.data(), int(block),
                                                   MPI_FLOAT, MPI_COMM_WORLD) == MPI_SUCCESS
                                         ? absl::OkStatus()
                                         : absl::InternalError("MPI_Allgather failed");
                            }));
    rows.push_back({"all_gather", rate(ours, 1), rate(raw, 1)});
    if (shm != nullptr) {
      STRATA_ASSIGN_OR_RETURN(double t, BestSeconds(iters, world, *s, [&] {
                                return shm->AllGather(send.data(), recv.data(), block, DType::kF32, *s).Wait();
                              }));
      rows.back().shm_gbps = rate(t, 1);
    }
  }
  {
    STRATA_ASSIGN_OR_RETURN(double ours, BestSeconds(iters, world, *s, [&] {
      return world.ReduceScatter(send.data(), out.data(), block, DType::kF32, comm::ReduceOp::kSum, *s).Wait();
    }));
    STRATA_ASSIGN_OR_RETURN(double raw, BestSeconds(iters, world, *s, [&] {
                              return MPI_Reduce_scatter_block(send.data(), out.data(), int(block), MPI_FLOAT, MPI_SUM,
                                                              MPI_COMM_WORLD) == MPI_SUCCESS
                                         ? absl::OkStatus()
                                         : absl::InternalError("MPI_Reduce_scatter_block failed");
                            }));
    rows.push_back({"reduce_scatter", rate(ours, 1), rate(raw, 1)});
    if (shm != nullptr) {
      STRATA_ASSIGN_OR_RETURN(
          double t, BestSeconds(iters, world, *s, [&] {
            return shm->ReduceScatter(send.data(), out.data(), block, DType::kF32, comm::ReduceOp::kSum, *s).Wait();
          }));
      rows.back().shm_gbps = rate(t, 1);
    }
  }
  {
    STRATA_ASSIGN_OR_RETURN(double ours, BestSeconds(iters, world, *s, [&] {
      return world.AllReduce(send.data(), recv.data(), full, DType::kF32, comm::ReduceOp::kSum, *s).Wait();
    }));
    STRATA_ASSIGN_OR_RETURN(double raw, BestSeconds(iters, world, *s, [&] {
      return MPI_Allreduce(send.data(), recv.data(), int(full), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS
                 ? absl::OkStatus() : absl::InternalError("MPI_Allreduce failed");
    }));
    rows.push_back({"all_reduce", rate(ours, 2), rate(raw, 2)});
    if (shm != nullptr) {
      STRATA_ASSIGN_OR_RETURN(
          double t, BestSeconds(iters, world, *s, [&] {
            return shm->AllReduce(send.data(), recv.data(), full, DType::kF32, comm::ReduceOp::kSum, *s).Wait();
          }));
      rows.back().shm_gbps = rate(t, 2);
    }
  }
  double floor_gbps = 0;
  if (shm != nullptr) {
    STRATA_ASSIGN_OR_RETURN(double t, BestSeconds(iters, world, *s, [&] {
                              std::memcpy(recv.data(), send.data(), full * 4);
                              return world.Barrier(*s).Wait();  // the floor is when the last rank's copy ends
                            }));
    floor_gbps = rate(t, 1);
  }
  if (world.rank() != 0) return absl::OkStatus();
  if (json) {
    std::string j = absl::StrCat("{\"ranks\":", n, ",\"bytes\":", full * 4);
    if (shm != nullptr) absl::StrAppend(&j, ",\"memcpy_floor_busbw_gbps\":", floor_gbps);
    for (const Row& r : rows) {
      absl::StrAppend(&j, ",\"", r.op, "\":{\"strata_busbw_gbps\":", r.strata_gbps, ",\"mpi_busbw_gbps\":", r.mpi_gbps,
                      ",\"ratio\":", r.strata_gbps / r.mpi_gbps);
      if (shm != nullptr) absl::StrAppend(&j, ",\"shm_busbw_gbps\":", r.shm_gbps);
      absl::StrAppend(&j, "}");
    }
    std::printf("%s}\n", j.c_str());
  } else {
    std::printf("%d ranks, %zu bytes, best of %d\n%-16s %14s %14s %7s", n, full * 4, iters, "collective", "strata GB/s",
                "raw MPI GB/s", "ratio");
    std::printf(shm != nullptr ? " %14s %9s\n" : "\n", "shm GB/s", "shm/MPI");
    for (const Row& r : rows) {
      std::printf("%-16s %14.3f %14.3f %7.2f", r.op, r.strata_gbps, r.mpi_gbps, r.strata_gbps / r.mpi_gbps);
      if (shm != nullptr) std::printf(" %14.3f %9.2f", r.shm_gbps, r.shm_gbps / r.strata_gbps);
      std::printf("\n");
    }
    if (shm != nullptr) std::printf("memcpy floor (every rank copies the buffer at once): %.3f GB/s\n", floor_gbps);
  }
  return absl::OkStatus();
}

const std::vector<spec::FlagDef>& CommFlagDefs() {
  static const auto* defs =
      new std::vector<spec::FlagDef>{{"bytes", false, "buffer size (default 128 MiB)"},
                                     {"iters", false, "repetitions; the best is reported (default 5)"},
                                     {"shm", true, "also the shared-memory back-end, and a memcpy floor"},
                                     {"json", true, "one JSON object"}};
  return *defs;
}

}  // namespace

std::string BenchCommUsage() {
  return spec::Flags::Usage("bench comm", CommFlagDefs()) +
         "  (under mpirun: the MPI back-end's collectives against raw MPI on the same buffers)\n";
}

int BenchCommCommand(const std::vector<std::string>& args) {
  auto mpi = spec::StartMpi("bench comm");
  if (mpi == nullptr) return 1;
  auto f = spec::Flags::Parse(args, CommFlagDefs());
  absl::Status s = f.status();
  if (s.ok()) {
    auto bytes = f->Int("bytes", 128 << 20);
    auto iters = f->Int("iters", 5);
    s = !bytes.ok() ? bytes.status() : !iters.ok() ? iters.status() : absl::OkStatus();
    if (s.ok() && (*bytes < 4 * mpi->world_size() || *bytes > (int64_t{1} << 33) || *iters < 1 || *iters > 1000000)) {
      s = absl::InvalidArgumentError("--bytes must be in [4 x ranks, 8 GiB] and --iters in [1, 1000000]");
    }
    if (s.ok()) {
      auto world = mpi->World(comm::Options{});
      std::unique_ptr<comm::Communicator> shm;
      if (world.ok() && f->Bool("shm")) {
        comm::Options o;
        o.name = "shm";
        auto made = comm::CreateShmCommunicator(**world, o);
        if (made.ok()) shm = std::move(*made);
        s = made.status();
      }
      if (s.ok()) {
        s = world.ok()
                ? Bench(**world, shm.get(), static_cast<size_t>(*bytes), static_cast<int>(*iters), f->Bool("json"))
                : world.status();
      }
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench comm: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
