// `strata bench nvme --path DIR[,DIR2...] --block-bytes B --queue-depth Q [--backend auto|uring|threads]
//                    [--total-bytes T] [--repeat N] [--no-fio] [--sqpoll] [--no-register] [--json]`
//
// Sequential write then read throughput of the NVMe store (runtime/offload/nvme_store.h: preallocated files,
// O_DIRECT when the file system allows it, one extent per block, Q blocks in flight through pinned,
// registered buffers, CRC-32 on every block), and fio's on the same files (the store's own), with the
// same block size, depth, size and direct flag, in the same run when fio is installed (ioengine io_uring with fixedbufs
// if fio has it, else libaio, else psync). Rounds alternate (store write, store read, fio write, fio read) `repeat`
// times and the median of each is reported, so a noisy neighbour on a shared disk hurts both alike.
//
// JSON keys: read_bytes_per_s, write_bytes_per_s, and when fio ran fio_read_bytes_per_s,
// fio_write_bytes_per_s, read_ratio, write_ratio (store / fio); plus the set-up (fs_type, direct_io,
// queue, pinned, registered_buffers, fio_command) and every sample.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/offload/io_queue.h"

namespace strata::tools {

struct NvmeBenchOptions {
  std::vector<std::string> paths;
  uint64_t block_bytes = 1 << 20;
  uint32_t queue_depth = 32;
  offload::IoBackend backend = offload::IoBackend::kAuto;
  uint64_t total_bytes = 256ull << 20;
  int repeat = 5;
  bool fio = true;
  bool sqpoll = false;
  bool register_buffers = true;  // IoQueue::RegisterBuffers(pool): READ_FIXED / WRITE_FIXED
};

absl::StatusOr<NvmeBenchOptions> ParseNvmeBenchOptions(const std::vector<std::string>& args, bool* json);

// Runs the benchmark and returns the JSON object described above.
absl::StatusOr<nlohmann::json> RunNvmeBench(const NvmeBenchOptions& options);

// Bandwidth (bytes/s) of fio's first job in the given direction, from `fio --output-format=json`
// output (leading non-JSON lines are skipped). InvalidArgument when absent or malformed.
absl::StatusOr<double> FioBandwidth(const std::string& fio_output, bool read);

int BenchNvmeCommand(const std::vector<std::string>& args);

}  // namespace strata::tools
