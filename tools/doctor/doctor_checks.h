// `strata doctor`'s verdicts: pure functions from recorded facts (doctor_facts.h) to one CheckResult
// each. Nothing here touches the machine, so every rule is tested on hand-written facts
// (tests/tools/doctor/doctor_test.cc).
//
// Rules, in one place (each function's comment gives its thresholds):
//  - fail: the job cannot run as configured, or runs wrong (mismatched GPUs, a CUDA runtime newer than
//    the driver's major version, pinned buffers beyond the locked-memory limit, a disk test error, a disk
//    without room for the job's NVMe stores).
//  - warn: it runs, slower than it should or with a known hazard (no GPU, GPUs across the CPU socket,
//    a narrowed PCIe link, thermal throttling, < 4 cores per GPU, less RAM than VRAM, no io_uring,
//    a slow NVMe path, no room for the NVMe state's asynchronous-checkpoint copy, no MPI launcher).
//  - ok: everything else, and every check that does not apply (it says why).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/config.h"
#include "spec/model_spec.h"
#include "tools/doctor/doctor_facts.h"

namespace strata::tools::doctor {

CheckResult CheckGpus(const DoctorFacts& f);
CheckResult CheckVersions(const DoctorFacts& f);
CheckResult CheckInterconnect(const DoctorFacts& f);
CheckResult CheckPcie(const DoctorFacts& f);
CheckResult CheckClocks(const DoctorFacts& f);
CheckResult CheckCpuCores(const DoctorFacts& f);
CheckResult CheckHostRam(const DoctorFacts& f);
CheckResult CheckIoUring(const DoctorFacts& f);
CheckResult CheckNvme(const DoctorFacts& f);
// The job's NVMe stores against their disks' free bytes, R = ranks_on_node ranks on each: fail below R x the
// need (the job cannot start), warn below R x (need + room) (it trains; steps over an asynchronous checkpoint
// wait for its writer), else ok. Every verdict says that checkpoints on the same disk need their own room.
CheckResult CheckNvmeSpace(const DoctorFacts& f);
CheckResult CheckMpi(const DoctorFacts& f);
CheckResult CheckLaunch(const DoctorFacts& f);
CheckResult CheckMemlock(const DoctorFacts& f);
// --measure: the host figures (doctor_measure.h) in one line; warn when a rate could not be measured
// (its reason), or when OMP_NUM_THREADS is unset (the product then uses every core, not one per rank).
CheckResult CheckHostFigures(const DoctorFacts& f);

// Every check above, in this order (host figures only when measured).
std::vector<CheckResult> RunChecks(const DoctorFacts& f);
// The worst verdict of a list (kOk for an empty one).
Verdict Worst(const std::vector<CheckResult>& checks);

// The pinned host bytes one rank needs for `cfg`'s offload settings on `model` over `ranks` ranks
// (Note [Pinned estimate] in doctor_checks.cc).
PinnedFacts EstimatePinned(const engine::EngineConfig& cfg, const spec::ModelSpec& model, int ranks);

// The job's NVMe stores per rank by directory (free bytes left for ProbeNvmeSpace), from the engine's own
// accounting as `strata plan` lays `model` out (plan::PlanMemory): its state sharded over `ranks`, in shard groups
// as `cfg` says ("node": `ranks_on_node`). Stores in one directory are one entry. Nothing offloaded to NVMe: no
// disks, offloaded false.
absl::StatusOr<NvmeSpaceFacts> EstimateNvmeSpace(const engine::EngineConfig& cfg,
                                                 std::shared_ptr<const spec::ModelSpec> model, int ranks,
                                                 int ranks_on_node);

// "12.4" from 12040 (CUDA encoding); "2.19.3" from an NCCL version code; "not found" for 0.
std::string CudaVersionText(int v);
std::string NcclVersionText(int v);
// Names of the set kThrottle* bits, comma-separated ("none" when zero).
std::string ThrottleText(uint64_t reasons);

}  // namespace strata::tools::doctor
