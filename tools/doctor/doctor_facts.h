// `strata doctor`: the recorded facts about a machine, and the verdict types.
//
// The doctor is split in two so that its judgement can be tested without the hardware it judges:
// probing (doctor_probe_*.cc: NVML, dlopen'd CUDA / NCCL, syscalls, a disk test) fills a DoctorFacts,
// and pure functions (doctor_checks.h) turn the facts into verdicts. Every field here is plain data
// that a test can write by hand; a field the probe could not read keeps its "unknown" value (0, "",
// -1) and the checks say so instead of guessing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::tools::doctor {

enum class Verdict { kOk, kWarn, kFail };
const char* VerdictName(Verdict v);  // "ok", "warn", "fail"

// NVML's nvmlGpuTopologyLevel_t values (nvml.h), kept numerically so a matrix copied from
// `nvidia-smi topo -m` or NVML reads the same. Only kSystem crosses the CPU socket interconnect.
enum TopologyLevel : int {
  kTopoUnknown = -1,
  kTopoInternal = 0,     // same board (multi-GPU card)
  kTopoSingle = 10,      // one PCIe switch
  kTopoMultiple = 20,    // several PCIe switches, no host bridge
  kTopoHostBridge = 30,  // through the CPU's PCIe host bridge
  kTopoNode = 40,        // between host bridges of one NUMA node
  kTopoSystem = 50,      // across the socket interconnect (QPI / UPI / Infinity Fabric)
};

// NVML clock-throttle ("clocks event") reason bits, nvmlClocksThrottleReason* in nvml.h.
inline constexpr uint64_t kThrottleGpuIdle = 0x1;
inline constexpr uint64_t kThrottleAppClocks = 0x2;
inline constexpr uint64_t kThrottleSwPowerCap = 0x4;
inline constexpr uint64_t kThrottleHwSlowdown = 0x8;
inline constexpr uint64_t kThrottleSyncBoost = 0x10;
inline constexpr uint64_t kThrottleSwThermal = 0x20;
inline constexpr uint64_t kThrottleHwThermal = 0x40;
inline constexpr uint64_t kThrottleHwPowerBrake = 0x80;
inline constexpr uint64_t kThrottleDisplayClocks = 0x100;

struct GpuFacts {
  int index = 0;
  std::string name;            // "NVIDIA H100 80GB HBM3"
  uint64_t memory_bytes = 0;   // total device memory
  int pcie_gen = -1, pcie_max_gen = -1;      // current and maximum link generation
  int pcie_width = -1, pcie_max_width = -1;  // current and maximum lanes
  int sm_clock_mhz = -1, sm_max_clock_mhz = -1;
  uint64_t throttle_reasons = 0;  // kThrottle* bits
};

struct VersionFacts {
  std::string driver;        // "550.54.15"; "" when no driver
  int driver_cuda = 0;       // the newest CUDA the driver supports, 1000*major + 10*minor (12040 = 12.4); 0 unknown
  int cuda_runtime = 0;      // cudaRuntimeGetVersion, same encoding; 0 = libcudart not found
  std::string cuda_runtime_error;
  int nccl = 0;              // ncclGetVersion: 10000*major + 100*minor + patch (>= 2.9), 1000*major + ... before
  std::string nccl_error;
};

struct NvmeFacts {
  std::string path;            // the directory tested; "" = not tested
  std::string skipped_reason;  // why it was not tested ("" when it was; with a path: the disk is too full for it)
  std::string error;           // a failure of the test itself, naming the call and errno
  bool direct_io = false;      // O_DIRECT accepted (else buffered with the page cache dropped)
  uint64_t test_bytes = 0;     // bytes written and read back
  double write_bytes_per_s = 0, read_bytes_per_s = 0;
};

// One file system the job's NVMe stores are on (the config's offload nvme_path; stores of one rank on the same
// file system are one entry), per rank from the engine's own accounting (engine::EngineMemoryNeed, as `strata
// plan` lays the model out: EstimateNvmeSpace), and its free bytes (statvfs, ProbeNvmeSpace).
struct NvmeDiskFacts {
  std::string path;            // the directory (the first store's where two directories share a file system)
  std::string stores;          // what the job keeps there: "optimizer state", "parameter shards" or both
  std::string error;           // statvfs failed (a missing path): why; the job cannot create its files
  uint64_t free_bytes = 0;     // f_bavail x f_frsize: what an unprivileged writer may still take
  uint64_t need_per_rank = 0;  // what each rank preallocates before it trains (the NVMe tier's part here)
  uint64_t room_per_rank = 0;  // the optimizer state's store once more, taken only where the disk has room
};

// The job's NVMe need against its disks (Note [NVMe room agreed] in runtime/engine/engine.cc).
struct NvmeSpaceFacts {
  bool offloaded = false;  // the config keeps anything on NVMe
  int ranks = 1;           // the ranks the state is sharded over (the need is one rank's)
  int ranks_on_node = 1;   // R: the ranks of this node, whose stores share its disks
  std::string error;       // the need could not be computed: why
  std::vector<NvmeDiskFacts> disks;
};

struct MpiFacts {
  bool built_with_mpi = false;
  std::string library_version;  // MPI_Get_library_version's first line
  std::string launcher_path;    // mpirun / mpiexec / srun found on PATH, "" when none
  int launcher_world_size = 0;  // set when this process was started by a launcher (0: not)
  int launcher_local_size = 0;  // the ranks that launcher started on this node (0: not set)
};

// A torchrun launch (runtime/comm/launcher.cc, Note [Launchers]) and its id exchange, tried for real.
struct LaunchFacts {
  bool torchrun = false;       // WORLD_SIZE set and no MPI launcher around this process
  int rank = 0, size = 1;
  std::string exchange;        // MASTER_ADDR:port of the id exchange
  std::string error;           // the variables or the exchange failed: why ("" when not)
  double exchange_ms = -1;     // the exchange's time (< 0: not tried)
  std::string rank0_host;      // what rank 0 sent: its host name
};

// What the configuration will pin in host memory, per rank (pure estimate, see EstimatePinned).
struct PinnedFacts {
  bool offloaded = false;   // anything offloaded at all
  bool pinned = false;      // pin_memory on for an offloaded kind
  uint64_t bytes_per_rank = 0;
  std::string breakdown;    // "optimizer state 16 B x 124M params / 8 ranks = ..."
};

// `--measure`: this host's rates for `strata plan --device-preset host --host-figures` (tools/doctor/
// doctor_measure.h says how each is taken). Keys in the JSON are the plan's flag names (matmul_gflops is
// --matmul-gflops). A rate not measured stays 0 and its reason is in the matching *_error.
struct HostFigures {
  bool measured = false;            // --measure was given
  int ranks = 1;                    // R: the ranks that will share this node
  std::string omp_num_threads;      // OMP_NUM_THREADS as the products saw it ("" = unset)
  int sgemm_m = 0, sgemm_k = 0, sgemm_n = 0;  // the product timed: [B*T, C] x [C, 4C] of the model
  double matmul_gflops = 0;         // per rank, with R ranks' products running at once (their mean)
  double matmul_gflops_one_rank = 0;  // one product alone
  double update_gbps = 0;           // AdamW stream rate, `strata bench adam --threads 1`
  std::string update_error;
  std::string launcher;             // what launched `strata bench comm`
  uint64_t comm_bytes = 0;          // the bandwidth buffer
  uint64_t alpha_bytes = 0;         // the small buffer alpha is taken from
  double allgather_gbps = 0, reduce_scatter_gbps = 0, allreduce_gbps = 0;  // bus bandwidths over R ranks
  double alpha_us = 0;              // per ring step
  std::string comm_error;           // why the collectives were not measured ("" when they were)
  double seconds = 0;               // the whole measurement's wall time
};

struct DoctorFacts {
  bool nvml_loaded = false;
  std::string nvml_error;          // why NVML could not be used ("" when loaded)
  std::optional<std::string> cuda_visible_devices;  // CUDA_VISIBLE_DEVICES when set
  std::vector<GpuFacts> gpus;
  // topology[i][j]: TopologyLevel between GPU i and j; nvlink[i][j]: P2P over NVLink reported OK.
  std::vector<std::vector<int>> topology;
  std::vector<std::vector<bool>> nvlink;
  VersionFacts versions;
  int cpu_cores = 0;               // CPUs this process may run on (affinity mask)
  uint64_t host_ram_bytes = 0;
  uint64_t memlock_limit_bytes = 0;  // RLIMIT_MEMLOCK soft limit; kUnlimited when unlimited
  bool lock_past_limit = false;      // CAP_IPC_LOCK in the effective set (root): mlock ignores that limit
  bool io_uring_ok = false;
  std::string io_uring_error;
  NvmeFacts nvme;
  NvmeSpaceFacts nvme_space;
  MpiFacts mpi;
  LaunchFacts launch;
  PinnedFacts pinned;
  HostFigures host;
};

inline constexpr uint64_t kUnlimited = ~uint64_t{0};

struct CheckResult {
  std::string name;
  Verdict verdict = Verdict::kOk;
  std::string detail;  // one line
};

}  // namespace strata::tools::doctor
