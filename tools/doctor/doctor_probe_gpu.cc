// GPU probes for `strata doctor`: NVML, the CUDA runtime and NCCL, each loaded with dlopen.
//
// Only the handful of NVML entry points used here are declared, with the C ABI of nvml.h (every
// function returns an int nvmlReturn_t, 0 = success; devices are opaque pointers), so the build needs
// neither the NVML header nor the library. Missing symbols (an old driver) leave their facts unknown.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/doctor/doctor_probe.h"

namespace strata::tools::doctor {
namespace {

// A dlopen handle, closed on destruction.
class DynamicLibrary {
 public:
  // Tries each name in turn; error() holds the first failure's dlerror text when none loads.
  explicit DynamicLibrary(const std::vector<const char*>& names) {
    for (const char* name : names) {
      handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) return;
      const char* e = dlerror();
      if (error_.empty()) error_ = e != nullptr ? e : absl::StrCat(name, ": not found");
    }
  }
  ~DynamicLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  // nullptr when the symbol is absent.
  template <typename Fn>
  Fn Symbol(const char* name) const {
    return handle_ == nullptr ? nullptr : reinterpret_cast<Fn>(dlsym(handle_, name));
  }

 private:
  void* handle_ = nullptr;
  std::string error_;
};

using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr int kNvmlClockSm = 1;            // NVML_CLOCK_SM
constexpr int kNvmlP2pCapsNvlink = 2;      // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kNvmlP2pStatusOk = 0;        // NVML_P2P_STATUS_OK

// The NVML entry points used, resolved once.
struct Nvml {
  explicit Nvml(const DynamicLibrary& lib)
      : init(lib.Symbol<int (*)()>("nvmlInit_v2")),
        shutdown(lib.Symbol<int (*)()>("nvmlShutdown")),
        error_string(lib.Symbol<const char* (*)(int)>("nvmlErrorString")),
        driver_version(lib.Symbol<int (*)(char*, unsigned)>("nvmlSystemGetDriverVersion")),
        cuda_version(lib.Symbol<int (*)(int*)>("nvmlSystemGetCudaDriverVersion_v2")),
        count(lib.Symbol<int (*)(unsigned*)>("nvmlDeviceGetCount_v2")),
        handle(lib.Symbol<int (*)(unsigned, NvmlDevice*)>("nvmlDeviceGetHandleByIndex_v2")),
        name(lib.Symbol<int (*)(NvmlDevice, char*, unsigned)>("nvmlDeviceGetName")),
        memory(lib.Symbol<int (*)(NvmlDevice, NvmlMemory*)>("nvmlDeviceGetMemoryInfo")),
        pcie_gen(lib.Symbol<int (*)(NvmlDevice, unsigned*)>("nvmlDeviceGetCurrPcieLinkGeneration")),
        pcie_max_gen(lib.Symbol<int (*)(NvmlDevice, unsigned*)>("nvmlDeviceGetMaxPcieLinkGeneration")),
        pcie_width(lib.Symbol<int (*)(NvmlDevice, unsigned*)>("nvmlDeviceGetCurrPcieLinkWidth")),
        pcie_max_width(lib.Symbol<int (*)(NvmlDevice, unsigned*)>("nvmlDeviceGetMaxPcieLinkWidth")),
        clock(lib.Symbol<int (*)(NvmlDevice, int, unsigned*)>("nvmlDeviceGetClockInfo")),
        max_clock(lib.Symbol<int (*)(NvmlDevice, int, unsigned*)>("nvmlDeviceGetMaxClockInfo")),
        throttle(lib.Symbol<int (*)(NvmlDevice, unsigned long long*)>("nvmlDeviceGetCurrentClocksEventReasons")),
        topology(lib.Symbol<int (*)(NvmlDevice, NvmlDevice, int*)>("nvmlDeviceGetTopologyCommonAncestor")),
        p2p(lib.Symbol<int (*)(NvmlDevice, NvmlDevice, int, int*)>("nvmlDeviceGetP2PStatus")) {
    if (throttle == nullptr) {  // the name before driver 535
      throttle = lib.Symbol<int (*)(NvmlDevice, unsigned long long*)>("nvmlDeviceGetCurrentClocksThrottleReasons");
    }
  }
  std::string Error(int code) const {
    return error_string != nullptr ? absl::StrCat(error_string(code), " (", code, ")")
                                   : absl::StrCat("NVML error ", code);
  }

  int (*init)();
  int (*shutdown)();
  const char* (*error_string)(int);
  int (*driver_version)(char*, unsigned);
  int (*cuda_version)(int*);
  int (*count)(unsigned*);
  int (*handle)(unsigned, NvmlDevice*);
  int (*name)(NvmlDevice, char*, unsigned);
  int (*memory)(NvmlDevice, NvmlMemory*);
  int (*pcie_gen)(NvmlDevice, unsigned*);
  int (*pcie_max_gen)(NvmlDevice, unsigned*);
  int (*pcie_width)(NvmlDevice, unsigned*);
  int (*pcie_max_width)(NvmlDevice, unsigned*);
  int (*clock)(NvmlDevice, int, unsigned*);
  int (*max_clock)(NvmlDevice, int, unsigned*);
  int (*throttle)(NvmlDevice, unsigned long long*);
  int (*topology)(NvmlDevice, NvmlDevice, int*);
  int (*p2p)(NvmlDevice, NvmlDevice, int, int*);
};

// Reads an unsigned NVML property into *out (left as is when the call is missing or fails).
void ReadUnsigned(int (*fn)(NvmlDevice, unsigned*), NvmlDevice d, int* out) {
  unsigned v = 0;
  if (fn != nullptr && fn(d, &v) == 0) *out = static_cast<int>(v);
}

GpuFacts ReadGpu(const Nvml& nvml, unsigned index, NvmlDevice d) {
  GpuFacts g;
  g.index = static_cast<int>(index);
  char name[96] = {0};  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
  if (nvml.name != nullptr && nvml.name(d, name, sizeof(name)) == 0) g.name = name;
  NvmlMemory mem{};
  if (nvml.memory != nullptr && nvml.memory(d, &mem) == 0) g.memory_bytes = mem.total;
  ReadUnsigned(nvml.pcie_gen, d, &g.pcie_gen);
  ReadUnsigned(nvml.pcie_max_gen, d, &g.pcie_max_gen);
  ReadUnsigned(nvml.pcie_width, d, &g.pcie_width);
  ReadUnsigned(nvml.pcie_max_width, d, &g.pcie_max_width);
  unsigned mhz = 0;
  if (nvml.clock != nullptr && nvml.clock(d, kNvmlClockSm, &mhz) == 0) g.sm_clock_mhz = static_cast<int>(mhz);
  if (nvml.max_clock != nullptr && nvml.max_clock(d, kNvmlClockSm, &mhz) == 0)
    g.sm_max_clock_mhz = static_cast<int>(mhz);
  unsigned long long reasons = 0;
  if (nvml.throttle != nullptr && nvml.throttle(d, &reasons) == 0) g.throttle_reasons = reasons;
  return g;
}

void ReadTopology(const Nvml& nvml, const std::vector<NvmlDevice>& devs, DoctorFacts* f) {
  const size_t n = devs.size();
  f->topology.assign(n, std::vector<int>(n, kTopoUnknown));
  f->nvlink.assign(n, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i) {
    f->topology[i][i] = kTopoInternal;
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      int level = kTopoUnknown, status = -1;
      if (nvml.topology != nullptr && nvml.topology(devs[i], devs[j], &level) == 0) f->topology[i][j] = level;
      if (nvml.p2p != nullptr && nvml.p2p(devs[i], devs[j], kNvmlP2pCapsNvlink, &status) == 0) {
        f->nvlink[i][j] = status == kNvmlP2pStatusOk;
      }
    }
  }
}

void ReadDevices(const Nvml& nvml, DoctorFacts* f) {
  char driver[96] = {0};
  if (nvml.driver_version != nullptr && nvml.driver_version(driver, sizeof(driver)) == 0) f->versions.driver = driver;
  if (nvml.cuda_version != nullptr) nvml.cuda_version(&f->versions.driver_cuda);
  unsigned count = 0;
  if (nvml.count == nullptr || nvml.handle == nullptr) {
    f->nvml_error = "libnvidia-ml.so.1 lacks nvmlDeviceGetCount_v2 / nvmlDeviceGetHandleByIndex_v2 (driver too old)";
    return;
  }
  if (const int rc = nvml.count(&count); rc != 0) {
    f->nvml_error = absl::StrCat("nvmlDeviceGetCount_v2: ", nvml.Error(rc));
    return;
  }
  f->nvml_loaded = true;
  std::vector<NvmlDevice> devs;
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice d = nullptr;
    if (nvml.handle(i, &d) != 0) continue;  // e.g. a GPU fallen off the bus: it is simply not listed
    devs.push_back(d);
    f->gpus.push_back(ReadGpu(nvml, i, d));
  }
  ReadTopology(nvml, devs, f);
}

template <typename Fn>
int ReadVersion(const std::vector<const char*>& names, const char* symbol, std::string* error) {
  DynamicLibrary lib(names);
  if (!lib.loaded()) {
    *error = lib.error();
    return 0;
  }
  const Fn fn = lib.Symbol<Fn>(symbol);
  int v = 0;
  if (fn == nullptr) {
    *error = absl::StrCat(symbol, " not exported");
  } else if (const int rc = fn(&v); rc != 0) {
    *error = absl::StrCat(symbol, " returned ", rc);
    v = 0;
  }
  return v;
}

}  // namespace

void ProbeGpus(DoctorFacts* f) {
  DynamicLibrary lib({"libnvidia-ml.so.1"});
  if (!lib.loaded()) {
    f->nvml_error = lib.error();
    return;
  }
  const Nvml nvml(lib);
  if (nvml.init == nullptr) {
    f->nvml_error = "libnvidia-ml.so.1 has no nvmlInit_v2";
    return;
  }
  if (const int rc = nvml.init(); rc != 0) {
    f->nvml_error = absl::StrCat("nvmlInit_v2: ", nvml.Error(rc));  // e.g. driver/library mismatch
    return;
  }
  ReadDevices(nvml, f);
  if (nvml.shutdown != nullptr) nvml.shutdown();
}

void ProbeLibraries(VersionFacts* v) {
  v->cuda_runtime = ReadVersion<int (*)(int*)>(
      {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "/usr/local/cuda/lib64/libcudart.so"},
      "cudaRuntimeGetVersion", &v->cuda_runtime_error);
  v->nccl = ReadVersion<int (*)(int*)>({"libnccl.so.2", "libnccl.so"}, "ncclGetVersion", &v->nccl_error);
}

}  // namespace strata::tools::doctor
