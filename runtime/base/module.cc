#include "runtime/base/module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstring>
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

std::vector<std::string> Candidates() {
  if (std::optional<std::string> forced = env::CudaModulePath()) return {*forced};
  const std::string dir = OwnDirectory();
  return {absl::StrCat(dir, "/", kCudaModuleFile), absl::StrCat(dir, "/../lib/", kCudaModuleFile)};
}

absl::Status CheckIdentity(const Loaded& m) {
  uint32_t has = 0;
  const auto* id = static_cast<const ModuleIdentity*>(m.entry(ModuleIdentity::kPart, ModuleIdentity::kVersion, &has));
  if (id == nullptr || std::strcmp(id->build, BuildId()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA back-end module ", m.path, " is of another build (",
        id == nullptr ? absl::StrCat("identity version ", has) : std::string(id->build), "; this library is ",
        BuildId(), "): install the libstrata_cuda.so built with this library"));
  }
  id->set_log_rank(LogRank());
  return absl::OkStatus();
}

absl::StatusOr<Loaded> Load() {
  std::vector<std::string> tried;
  for (const std::string& path : Candidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried.push_back(absl::StrCat(path, " (", why != nullptr ? why : "dlopen failed", ")"));
      continue;
    }
    Loaded m{path, reinterpret_cast<ModuleEntry>(dlsym(handle, kCudaModuleEntry))};
    if (m.entry == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the CUDA back-end module ", path, " has no entry point ", kCudaModuleEntry));
    }
    STRATA_RETURN_IF_ERROR(CheckIdentity(m));
    return m;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the CUDA back-end module ", kCudaModuleFile, " could not be loaded (tried ",
                   absl::StrJoin(tried, "; "), "): install it beside libstrata, or name it in STRATA_CUDA_MODULE"));
}

// Note [One module per process]: loaded on the first use and kept to the end (never dlclose'd: objects it
// made, and their vtables, may outlive any owner here). A failure is kept too: what is on disk does not
// change under a running process, and every later request gets the same answer.
const absl::StatusOr<Loaded>& Module() {
  static const absl::StatusOr<Loaded>* const loaded = new absl::StatusOr<Loaded>(Load());
  return *loaded;
}

}  // namespace

const char* BuildId() { return STRATA_MODULE_BUILD " headers " STRATA_MODULE_HEADERS; }

absl::StatusOr<const void*> CudaModulePart(const char* name, uint32_t version) {
  const absl::StatusOr<Loaded>& m = Module();
  if (!m.ok()) return m.status();
  uint32_t has = 0;
  const void* part = m->entry(name, version, &has);
  if (part == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA back-end module ", m->path, " has part '", name, "' at version ", has, ", not ", version,
        ": install the libstrata_cuda.so built with this library"));
  }
  return part;
}

std::string LoadedCudaModulePath() {
  const absl::StatusOr<Loaded>& m = Module();
  return m.ok() ? m->path : std::string();
}

}  // namespace strata::module
