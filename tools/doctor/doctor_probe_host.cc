// Host probes for `strata doctor`: cores, RAM, the locked-memory limit, io_uring, MPI.
// Environment variables come through runtime/base/env.h only (CONVENTIONS 6).
#include <sched.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/env.h"
#include "tools/doctor/doctor_probe.h"

#if defined(STRATA_DOCTOR_LIBURING)
#include <liburing.h>
#else
#include <linux/io_uring.h>
#include <sys/syscall.h>
#endif

#if defined(STRATA_WITH_MPI)
#include <mpi.h>
#endif

namespace strata::tools::doctor {
namespace {

std::string ErrnoText(int err) {
  char buf[128];
  return absl::StrCat(strerror_r(err, buf, sizeof(buf)), " (errno ", err, ")");
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 0;
}

uint64_t HostRamBytes() {
  struct sysinfo info;
  if (sysinfo(&info) != 0) return 0;
  return static_cast<uint64_t>(info.totalram) * info.mem_unit;
}

uint64_t MemlockLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? kUnlimited : static_cast<uint64_t>(rl.rlim_cur);
}

// Whether this process holds CAP_IPC_LOCK (bit 14 of CapEff in /proc/self/status), as root does: the kernel then
// lets mlock go past RLIMIT_MEMLOCK, so a low limit does not stop the job's pinned buffers.
bool LockPastLimit() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return false;
  char line[256];
  unsigned long long caps = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f) != nullptr) found = std::sscanf(line, "CapEff: %llx", &caps) == 1;
  std::fclose(f);
  constexpr int kCapIpcLock = 14;
  return found && ((caps >> kCapIpcLock) & 1) != 0;
}

// Sets up and tears down a small ring: what the NVMe store would do first. EPERM usually means
// seccomp (containers) or kernel.io_uring_disabled; ENOSYS a kernel before 5.1.
void ProbeIoUring(DoctorFacts* f) {
#if defined(STRATA_DOCTOR_LIBURING)
  struct io_uring ring;
  const int rc = io_uring_queue_init(8, &ring, 0);
  f->io_uring_ok = rc == 0;
  if (rc == 0) io_uring_queue_exit(&ring);
  else f->io_uring_error = absl::StrCat("io_uring_queue_init: ", ErrnoText(-rc));
#else
  struct io_uring_params params;
  std::memset(&params, 0, sizeof(params));
  const long fd = syscall(__NR_io_uring_setup, 8, &params);
  f->io_uring_ok = fd >= 0;
  if (fd >= 0) close(static_cast<int>(fd));
  else f->io_uring_error = absl::StrCat("io_uring_setup: ", ErrnoText(errno));
#endif
}

std::string FindLauncher() {
  const std::vector<std::string> dirs = absl::StrSplit(env::ExecutableSearchPath(), ':', absl::SkipEmpty());
  for (const char* name : {"mpirun", "mpiexec", "srun"}) {
    for (const std::string& dir : dirs) {
      const std::string path = absl::StrCat(dir, "/", name);
      if (access(path.c_str(), X_OK) == 0) return path;
    }
  }
  return "";
}

void ProbeMpi(MpiFacts* m) {
#if defined(STRATA_WITH_MPI)
  m->built_with_mpi = true;
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  // Allowed before MPI_Init (MPI-3.0 section 8.1.1): the doctor never initialises MPI.
  if (MPI_Get_library_version(version, &len) == MPI_SUCCESS) {
    m->library_version = std::string(version, strnlen(version, sizeof(version)));
    m->library_version = m->library_version.substr(0, m->library_version.find_first_of(",\n"));
  } else {
    m->library_version = "MPI library version unknown";
  }
#endif
  m->launcher_path = FindLauncher();
  m->launcher_world_size = env::LauncherWorldSize().value_or(0);
  m->launcher_local_size = env::LauncherLocalWorldSize().value_or(0);
}

}  // namespace

void ProbeHost(DoctorFacts* f) {
  f->cpu_cores = UsableCores();
  f->host_ram_bytes = HostRamBytes();
  f->memlock_limit_bytes = MemlockLimit();
  f->lock_past_limit = LockPastLimit();
  f->cuda_visible_devices = env::CudaVisibleDevices();
  ProbeIoUring(f);
  ProbeMpi(&f->mpi);
}

}  // namespace strata::tools::doctor
