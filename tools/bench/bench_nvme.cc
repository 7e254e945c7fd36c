// `strata bench nvme`: see bench_nvme.h.
//
// Note [Same file]. fio reads and writes the store's own preallocated files, in the rounds between
// the store's passes (each round: store write, store read, fio write, fio read; the store rewrites
// every block before it reads again, so fio's writes never meet a checksum). On the shared virtual
// disk of the development machines, read throughput depended on which file was read (its blocks'
// place on the host) by up to 2x, so separate files made the ratio measure the files, not the code.
#include "tools/bench/bench_nvme.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/crc32.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"
#include "spec/flags.h"
#include "tools/bench/subprocess.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<spec::FlagDef> NvmeBenchFlagDefs() {
  return {
      {"path", false, "DIR[,DIR...]: directories for the store's files (several: striped); fio runs on those files"},
      {"block-bytes", false, "bytes per I/O, a multiple of 4096 (suffixes: 1MiB)"},
      {"queue-depth", false, "I/Os in flight"},
      {"backend", false, "auto|uring|threads (default auto)"},
      {"total-bytes", false, "bytes written then read per run (default 256MiB)"},
      {"repeat", false, "alternating store/fio rounds; the median of each is reported (default 5)"},
      {"no-fio", true, "skip the fio reference"},
      {"sqpoll", true, "ask io_uring for a kernel SQ polling thread (IORING_SETUP_SQPOLL)"},
      {"no-register", true, "do not register the staging buffers (plain READ / WRITE instead of *_FIXED)"},
      {"json", true, "print one JSON object"}};
}

// The store side: one extent per block, `depth` pinned buffers cycling through them.
class StoreBench {
 public:
  absl::Status SetUp(const NvmeBenchOptions& o, json* setup);
  absl::StatusOr<double> Run(bool read);  // bytes per second
  offload::IoQueueStats queue_stats() const { return queue_->stats(); }
  std::string FileList() const {          // fio's --filename syntax
    std::vector<std::string> paths;
    for (size_t f = 0; f < store_->files().file_count(); ++f)
      paths.push_back(store_->files().reopen_path(static_cast<int>(f)));  // the files have no names
    return absl::StrJoin(paths, ":");
  }

 private:
  // Declaration order is teardown order, reversed: extents and leases go before the store and the pool,
  // the queue after both, the allocator last.
  memory::MemoryTracker tracker_;
  memory::HostAllocator pinned_alloc_{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker_};
  std::unique_ptr<offload::IoQueue> queue_;
  std::unique_ptr<offload::PinnedPool> pool_;
  std::unique_ptr<offload::NvmeStore> store_;
  std::vector<offload::PinnedBuffer> buffers_;
  std::vector<offload::NvmeExtent> extents_;
  uint64_t block_ = 0;
};

absl::Status StoreBench::SetUp(const NvmeBenchOptions& o, json* setup) {
  block_ = o.block_bytes;
  STRATA_ASSIGN_OR_RETURN(queue_,
                          offload::CreateIoQueue(offload::IoQueueOptions{
                              .backend = o.backend, .depth = o.queue_depth, .sqpoll = o.sqpoll, .name = "bench"}));
  offload::PinnedPoolOptions po{.buffer_count = o.queue_depth, .buffer_bytes = o.block_bytes};
  auto pool = offload::PinnedPool::Create(po, &pinned_alloc_);
  if (!pool.ok() && pool.status().code() == absl::StatusCode::kFailedPrecondition) {
    STRATA_LOG(Warning) << "bench nvme: staging buffers not page-locked: " << pool.status().message();
    po.pin = offload::PinMethod::kNone;
    pool = offload::PinnedPool::Create(po, &pinned_alloc_);
  }
  if (!pool.ok()) return pool.status();
  pool_ = std::move(pool).value();
  const absl::Status reg =
      o.register_buffers ? queue_->RegisterBuffers(pool_->buffers()) : absl::CancelledError("--no-register");
  if (!reg.ok() && o.register_buffers) {
    STRATA_LOG(Warning) << "bench nvme: buffers not registered: " << reg.message();
  }
  offload::NvmeStoreOptions so;
  so.files.paths = o.paths;
  so.files.name = absl::StrCat("bench", getpid());
  so.files.capacity_bytes = o.total_bytes;
  STRATA_ASSIGN_OR_RETURN(store_, offload::NvmeStore::Create(so, queue_.get()));
  for (uint64_t done = 0; done < o.total_bytes; done += o.block_bytes) {
    STRATA_ASSIGN_OR_RETURN(offload::NvmeExtent e, store_->Allocate(o.block_bytes, memory::Kind::kScratch));
    extents_.push_back(std::move(e));
  }
  for (uint32_t i = 0; i < o.queue_depth; ++i) {
    buffers_.push_back(pool_->Acquire());
    char* p = static_cast<char*>(buffers_.back().data());
    for (uint64_t k = 0; k < o.block_bytes; ++k) p[k] = static_cast<char>((k * 2654435761u + i) >> 11);  // not zeros
  }
  (*setup)["fs_type"] = store_->files().fs_type(0);
  (*setup)["direct_io"] = store_->direct_io();
  (*setup)["queue"] = queue_->description();
  (*setup)["pinned"] = pool_->locked();
  (*setup)["registered_buffers"] = reg.ok() && queue_->backend() == offload::IoBackend::kUring;
  (*setup)["checksum"] = absl::StrCat("crc32 (", Crc32Implementation(), ") per block");
  return absl::OkStatus();
}

absl::StatusOr<double> StoreBench::Run(bool read) {
  if (read && !store_->direct_io()) {  // buffered: read from the disk, not the page cache, like fio's invalidate
    for (size_t f = 0; f < store_->files().file_count(); ++f) {
      fdatasync(store_->files().fd(static_cast<int>(f)));
      posix_fadvise(store_->files().fd(static_cast<int>(f)), 0, 0, POSIX_FADV_DONTNEED);
    }
  }
  const size_t depth = buffers_.size();
  std::vector<offload::IoWork> inflight(depth);
  absl::Status status;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < extents_.size() && status.ok(); ++i) {
    const size_t slot = i % depth;  // its buffer was last used by block i - depth, the oldest in flight
    status = inflight[slot].Wait();
    const memory::BufferView buf = buffers_[slot].view().Slice(0, block_);
    inflight[slot] = read ? store_->Read(extents_[i], buf) : store_->Write(extents_[i], buf);
  }
  const absl::Status drained = offload::WaitAll(inflight);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  STRATA_RETURN_IF_ERROR(status);
  STRATA_RETURN_IF_ERROR(drained);
  return static_cast<double>(extents_.size() * block_) / std::max(secs, 1e-9);
}

// fio's engine of choice on this machine, or NotFound when fio is not installed.
absl::StatusOr<std::string> FioEngine() {
  auto version = RunAndCapture({"fio", "--version"});
  if (!version.ok()) return absl::NotFoundError(absl::StrCat("fio not usable: ", version.status().message()));
  auto engines = RunAndCapture({"fio", "--enghelp"});
  const std::string list = engines.ok() ? *engines : "";
  if (list.find("io_uring") != std::string::npos) return std::string("io_uring");
  if (list.find("libaio") != std::string::npos) return std::string("libaio");
  return std::string("psync");
}

std::vector<std::string> FioArgv(const NvmeBenchOptions& o, const std::string& files, const std::string& engine,
                                 bool direct, bool read) {
  std::vector<std::string> argv = {"fio",
                                   "--name=strata-bench-nvme",
                                   "--filename=" + files,
                                   absl::StrCat("--rw=", read ? "read" : "write"),
                                   absl::StrCat("--bs=", o.block_bytes),
                                   absl::StrCat("--iodepth=", o.queue_depth),
                                   absl::StrCat("--size=", o.total_bytes),
                                   "--ioengine=" + engine,
                                   absl::StrCat("--direct=", direct ? 1 : 0),
                                   "--output-format=json"};
  if (engine == "io_uring") argv.push_back("--fixedbufs=1");  // as the store registers its buffers
  if (o.paths.size() > 1) argv.push_back("--file_service_type=roundrobin");
  return argv;
}

// The median sample: robust to the bursts of a shared disk in either direction (best-of would crown
// whichever side happened to hit a quiet moment).
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

absl::StatusOr<double> FioBandwidth(const std::string& fio_output, bool read) {
  const size_t brace = fio_output.find('{');
  if (brace == std::string::npos) return absl::InvalidArgumentError("fio printed no JSON");
  const json j = json::parse(fio_output.begin() + brace, fio_output.end(), nullptr, /*allow_exceptions=*/false);
  const char* dir = read ? "read" : "write";
  if (j.is_discarded() || !j.contains("jobs") || !j["jobs"].is_array() || j["jobs"].empty() ||
      !j["jobs"][0].contains(dir) || !j["jobs"][0][dir].contains("bw_bytes")) {
    return absl::InvalidArgumentError(absl::StrCat("fio JSON has no jobs[0].", dir, ".bw_bytes"));
  }
  return j["jobs"][0][dir]["bw_bytes"].get<double>();
}

namespace {

struct Samples {
  std::vector<double> write, read, fio_write, fio_read;
};

// `repeat` rounds of: store write, store read, then (when fio is usable) fio write, fio read.
absl::Status RunRounds(const NvmeBenchOptions& o, StoreBench& store, const absl::StatusOr<std::string>& engine,
                       bool direct, Samples* out) {
  const std::string files = store.FileList();  // Note [Same file]
  for (int rep = 0; rep < o.repeat; ++rep) {
    for (bool read : {false, true}) {
      STRATA_ASSIGN_OR_RETURN(const double bw, store.Run(read));
      (read ? out->read : out->write).push_back(bw);
    }
    if (!engine.ok()) continue;
    for (bool read : {false, true}) {
      STRATA_ASSIGN_OR_RETURN(const std::string fio_out, RunAndCapture(FioArgv(o, files, *engine, direct, read)));
      auto bw = FioBandwidth(fio_out, read);
      if (!bw.ok()) return Annotate(bw.status(), "fio");
      (read ? out->fio_read : out->fio_write).push_back(*bw);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> RunNvmeBench(const NvmeBenchOptions& o) {
  json out = {{"path", absl::StrJoin(o.paths, ",")},
              {"block_bytes", o.block_bytes},
              {"queue_depth", o.queue_depth},
              {"total_bytes", o.total_bytes},
              {"repeat", o.repeat},
              {"backend", offload::IoBackendName(o.backend)}};
  StoreBench store;
  STRATA_RETURN_IF_ERROR(store.SetUp(o, &out));
  const bool direct = out["direct_io"].get<bool>();
  const absl::StatusOr<std::string> engine = o.fio ? FioEngine() : absl::NotFoundError("--no-fio");
  Samples s;
  STRATA_RETURN_IF_ERROR(RunRounds(o, store, engine, direct, &s));
  const offload::IoQueueStats qs = store.queue_stats();
  out["queue_stats"] = {
      {"requests", qs.requests}, {"fixed_buffer_ios", qs.fixed_buffer_ios}, {"resubmits", qs.resubmits}};
  out["write_bytes_per_s"] = Median(s.write);
  out["read_bytes_per_s"] = Median(s.read);
  out["samples"] = {{"write", s.write}, {"read", s.read}};
  if (!engine.ok()) {
    out["fio"] = std::string(engine.status().message());
    return out;
  }
  out["fio_ioengine"] = *engine;
  out["fio_command"] = absl::StrJoin(FioArgv(o, store.FileList(), *engine, direct, true), " ");
  out["fio_write_bytes_per_s"] = Median(s.fio_write);
  out["fio_read_bytes_per_s"] = Median(s.fio_read);
  out["write_ratio"] = Median(s.write) / std::max(Median(s.fio_write), 1.0);
  out["read_ratio"] = Median(s.read) / std::max(Median(s.fio_read), 1.0);
  out["samples"]["fio_write"] = s.fio_write;
  out["samples"]["fio_read"] = s.fio_read;
  return out;
}

absl::StatusOr<NvmeBenchOptions> ParseNvmeBenchOptions(const std::vector<std::string>& args, bool* json_out) {
  STRATA_ASSIGN_OR_RETURN(spec::Flags f, spec::Flags::Parse(args, NvmeBenchFlagDefs()));
  if (!f.positional().empty())
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f.positional()[0], "'"));
  NvmeBenchOptions o;
  o.paths = absl::StrSplit(f.Str("path"), ',', absl::SkipEmpty());
  if (o.paths.empty()) return absl::InvalidArgumentError("--path DIR is required");
  STRATA_ASSIGN_OR_RETURN(o.block_bytes, ParseBytes(f.Str("block-bytes", "1MiB")));
  if (o.block_bytes == 0 || o.block_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-bytes ", o.block_bytes, " is not a positive multiple of 4096"));
  }
  STRATA_ASSIGN_OR_RETURN(const int64_t depth, f.Int("queue-depth", 32));
  if (depth < 1 || depth > 4096) return absl::InvalidArgumentError("--queue-depth must be in [1, 4096]");
  o.queue_depth = static_cast<uint32_t>(depth);
  STRATA_ASSIGN_OR_RETURN(o.backend, offload::ParseIoBackend(f.Str("backend", "auto")));
  STRATA_ASSIGN_OR_RETURN(o.total_bytes, ParseBytes(f.Str("total-bytes", "256MiB")));
  o.total_bytes = std::max(o.total_bytes / o.block_bytes, uint64_t{1}) * o.block_bytes;
  STRATA_ASSIGN_OR_RETURN(const int64_t repeat, f.IntIn("repeat", 5, 1, 1000000));
  o.repeat = static_cast<int>(repeat);
  o.fio = !f.Bool("no-fio");
  o.sqpoll = f.Bool("sqpoll");
  o.register_buffers = !f.Bool("no-register");
  *json_out = f.Bool("json");
  return o;
}

std::string BenchNvmeUsage() { return spec::Flags::Usage("bench nvme", NvmeBenchFlagDefs()); }

int BenchNvmeCommand(const std::vector<std::string>& args) {
  bool as_json = false;
  auto o = ParseNvmeBenchOptions(args, &as_json);
  if (!o.ok()) {
    std::fprintf(stderr, "strata bench nvme: %s\n%s", std::string(o.status().message()).c_str(),
                 spec::Flags::Usage("bench nvme", NvmeBenchFlagDefs()).c_str());
    return 2;
  }
  auto result = RunNvmeBench(*o);
  if (!result.ok()) {
    std::fprintf(stderr, "strata bench nvme: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  const json& j = *result;
  if (as_json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("strata bench nvme: %s (%s, %s), %s blocks, depth %u, %s, %s\n", j["path"].get<std::string>().c_str(),
              j["fs_type"].get<std::string>().c_str(), j["direct_io"].get<bool>() ? "O_DIRECT" : "buffered",
              FormatBytes(o->block_bytes).c_str(), o->queue_depth, FormatBytes(o->total_bytes).c_str(),
              j["queue"].get<std::string>().c_str());
  for (const char* dir : {"write", "read"}) {
    const double store = j[absl::StrCat(dir, "_bytes_per_s")].get<double>();
    std::printf("  %-5s  store %8.1f MB/s", dir, store / 1e6);
    if (j.contains("fio_ioengine")) {
      std::printf("   fio (%s) %8.1f MB/s   ratio %.2f", j["fio_ioengine"].get<std::string>().c_str(),
                  j[absl::StrCat("fio_", dir, "_bytes_per_s")].get<double>() / 1e6,
                  j[absl::StrCat(dir, "_ratio")].get<double>());
    }
    std::printf("\n");
  }
  if (j.contains("fio")) std::printf("  (no fio reference: %s)\n", j["fio"].get<std::string>().c_str());
  return 0;
}

}  // namespace strata::tools
