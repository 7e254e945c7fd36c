#include "runtime/base/module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/env.h"
#include "runtime/base/logging.h"
#include "strata_module_headers.h"  // STRATA_MODULE_HEADERS: generated (runtime/base/CMakeLists.txt)

#ifndef STRATA_MODULE_BUILD
#error "STRATA_MODULE_BUILD must be defined by the build (runtime/base/CMakeLists.txt)"
#endif

namespace strata::module {
namespace {

// What differs between the modules: the file, its entry point, the variable that overrides the file, the name
// in messages, and what to do when it cannot be loaded.
struct ModuleKind {
  const char* what;  // "CUDA back-end"
  const char* file;
  const char* entry;
  std::optional<std::string> (*forced)();  // the env override
  const char* fix;                         // appended to "could not be loaded (tried ...): "
};

const ModuleKind kCuda{"CUDA back-end", kCudaModuleFile, kCudaModuleEntry, &env::CudaModulePath,
                       "install it beside libstrata, or name it in STRATA_CUDA_MODULE"};
// The MPI module needs libmpi: where it is missing, dlerror() names it, and the fix is Open MPI or no MPI at all.
const ModuleKind kMpi{"MPI back-end", kMpiModuleFile, kMpiModuleEntry, &env::MpiModulePath,
                      "an MPI communicator needs Open MPI's libmpi (install Open MPI, e.g. apt-get install "
                      "libopenmpi-dev, and launch with mpirun) and libstrata_mpi.so beside libstrata (or named in "
                      "STRATA_MPI_MODULE); without MPI, launch with torchrun (strata.torch runs over "
                      "torch.distributed) or use an in-process or foreign communicator"};

struct Loaded {
  std::string path;
  ModuleEntry entry = nullptr;
};

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The directory of the object this code was linked into: libstrata.so through dladdr, the executable
// (whose name dladdr does not give reliably) through /proc/self/exe.
std::string OwnDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&CudaModulePart), &info) != 0 && info.dli_fname != nullptr &&
      std::strstr(info.dli_fname, ".so") != nullptr && std::strchr(info.dli_fname, '/') != nullptr) {
    return Dirname(info.dli_fname);
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return ".";
  return Dirname(std::string(exe, static_cast<size_t>(n)));
}

std::vector<std::string> Candidates(const ModuleKind& kind) {
  if (std::optional<std::string> forced = kind.forced()) return {*forced};
  const std::string dir = OwnDirectory();
  return {absl::StrCat(dir, "/", kind.file), absl::StrCat(dir, "/../lib/", kind.file)};
}

absl::Status CheckIdentity(const ModuleKind& kind, const Loaded& m) {
  uint32_t has = 0;
  const auto* id = static_cast<const ModuleIdentity*>(m.entry(ModuleIdentity::kPart, ModuleIdentity::kVersion, &has));
  if (id == nullptr || std::strcmp(id->build, BuildId()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", kind.what, " module ", m.path, " is of another build (",
                     id == nullptr ? absl::StrCat("identity version ", has) : std::string(id->build),
                     "; this library is ", BuildId(), "): install the ", kind.file, " built with this library"));
  }
  id->set_log_rank(LogRank());
  return absl::OkStatus();
}

absl::StatusOr<Loaded> Load(const ModuleKind& kind) {
  std::vector<std::string> tried;
  for (const std::string& path : Candidates(kind)) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried.push_back(absl::StrCat(path, " (", why != nullptr ? why : "dlopen failed", ")"));
      continue;
    }
    Loaded m{path, reinterpret_cast<ModuleEntry>(dlsym(handle, kind.entry))};
    if (m.entry == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ", kind.what, " module ", path, " has no entry point ", kind.entry));
    }
    STRATA_RETURN_IF_ERROR(CheckIdentity(kind, m));
    return m;
  }
  return absl::FailedPreconditionError(absl::StrCat("the ", kind.what, " module ", kind.file,
                                                    " could not be loaded (tried ", absl::StrJoin(tried, "; "),
                                                    "): ", kind.fix));
}

// Note [One module per process]: loaded on the first use and kept to the end (never dlclose'd: objects it
// made, and their vtables, may outlive any owner here). A failure is kept too: what is on disk does not
// change under a running process, and every later request gets the same answer. One such slot per module.
template <const ModuleKind& kKind>
const absl::StatusOr<Loaded>& Module() {
  static const absl::StatusOr<Loaded>* const loaded = new absl::StatusOr<Loaded>(Load(kKind));
  return *loaded;
}

absl::StatusOr<const void*> Part(const ModuleKind& kind, const absl::StatusOr<Loaded>& m, const char* name,
                                 uint32_t version) {
  if (!m.ok()) return m.status();
  uint32_t has = 0;
  const void* part = m->entry(name, version, &has);
  if (part == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the ", kind.what, " module ", m->path, " has part '", name,
                                                      "' at version ", has, ", not ", version, ": install the ",
                                                      kind.file, " built with this library"));
  }
  return part;
}

}  // namespace

const void* FindPart(const PartEntry* parts, size_t count, const char* name, uint32_t version, uint32_t* has_version) {
  uint32_t has = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::strcmp(parts[i].name, name) != 0) continue;
    if (parts[i].version == version) return parts[i].table;
    has = parts[i].version;
  }
  if (has_version != nullptr) *has_version = has;
  return nullptr;
}

const char* BuildId() { return STRATA_MODULE_BUILD " headers " STRATA_MODULE_HEADERS; }

absl::StatusOr<const void*> CudaModulePart(const char* name, uint32_t version) {
  return Part(kCuda, Module<kCuda>(), name, version);
}

std::string LoadedCudaModulePath() {
  const absl::StatusOr<Loaded>& m = Module<kCuda>();
  return m.ok() ? m->path : std::string();
}

absl::StatusOr<const void*> MpiModulePart(const char* name, uint32_t version) {
  return Part(kMpi, Module<kMpi>(), name, version);
}

}  // namespace strata::module
