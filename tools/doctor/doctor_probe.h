// `strata doctor`'s probes: read this machine into DoctorFacts (doctor_facts.h).
//
// Nothing here decides a verdict, and nothing fails the process: a probe that cannot read something
// records why (an error string in the facts) and leaves the field unknown. NVML, the CUDA runtime and
// NCCL are loaded with dlopen at run time, so the binary has no link-time dependency on them and runs
// on machines without a driver.
#pragma once

#include <cstdint>
#include <string>

#include "tools/doctor/doctor_facts.h"

namespace strata::tools::doctor {

// GPUs, their PCIe links, clocks, throttle reasons and pairwise topology through libnvidia-ml.so.1;
// the driver version and the CUDA level it supports. Sets nvml_loaded / nvml_error.
void ProbeGpus(DoctorFacts* f);

// cudaRuntimeGetVersion from libcudart and ncclGetVersion from libnccl, when they load.
void ProbeLibraries(VersionFacts* v);

// Usable cores, host RAM, RLIMIT_MEMLOCK, io_uring, MPI library and launcher, CUDA_VISIBLE_DEVICES.
void ProbeHost(DoctorFacts* f);

// Sequential O_DIRECT write then read of up to `max_bytes` in a temporary file under `dir` (unlinked
// as soon as it is open, so nothing is left behind even on a crash), each direction cut off after
// `max_seconds`. Uses at most a quarter of the free space; where that is under 16 MiB nothing is written and
// skipped_reason says so. Errors name the call, the path and errno.
NvmeFacts ProbeNvme(const std::string& dir, uint64_t max_bytes, double max_seconds);

// The free bytes of each of `s`'s disks (statvfs); entries whose directories are on one file system (stat's
// st_dev) become one, their needs summed. A path that cannot be read keeps its entry with the error.
void ProbeNvmeSpace(NvmeSpaceFacts* s);

}  // namespace strata::tools::doctor
