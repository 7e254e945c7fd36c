/* A stand-in libnvidia-ml.so.1 for testing `strata doctor`'s NVML probe on machines without a driver.
 * It implements, with nvml.h's C ABI, only the entry points the probe resolves, and describes a
 * recorded machine: 4 x H100 on two sockets, GPUs 0-1 and 2-3 behind one PCIe switch each (PIX), SYS
 * across, NVLink between none; GPU 2 thermally throttled, GPU 3's link trained at x8 of x16. */
#include <string.h>

typedef struct {
  int index;
} FakeDevice;
typedef FakeDevice* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

static FakeDevice devices[4] = {{0}, {1}, {2}, {3}};

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char* nvmlErrorString(int rc) { return rc == 0 ? "Success" : "Fake error"; }

static int Copy(char* out, unsigned len, const char* text) {
  if (strlen(text) + 1 > len) return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
  strcpy(out, text);
  return 0;
}

int nvmlSystemGetDriverVersion(char* out, unsigned len) { return Copy(out, len, "550.54.15"); }
int nvmlSystemGetCudaDriverVersion_v2(int* v) { *v = 12040; return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { *n = 4; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
  if (i >= 4) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetName(nvmlDevice_t d, char* out, unsigned len) { return Copy(out, len, "NVIDIA H100 80GB HBM3"); }
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  m->total = 85520809984ull;
  m->free = m->total;
  m->used = 0;
  return 0;
}
int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned* v) { *v = 1; return 0; } /* idle */
int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned* v) { *v = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned* v) { *v = d->index == 3 ? 8 : 16; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned* v) { *v = 16; return 0; }
int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned* v) { *v = d->index == 2 ? 1200 : 345; return 0; }
int nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned* v) { *v = 1980; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long* r) {
  *r = d->index == 2 ? 0x40ull : 0x1ull; /* hw_thermal : idle */
  return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int* level) {
  *level = a->index / 2 == b->index / 2 ? 10 : 50; /* SINGLE (PIX) inside a socket, SYSTEM across */
  return 0;
}
int nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int caps, int* status) {
  *status = caps == 2 ? 4 : 0; /* NVLINK: NVML_P2P_STATUS_NOT_SUPPORTED */
  return 0;
}
