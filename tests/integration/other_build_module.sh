# Sourced by the module tests (core_library.sh, mpi_module.sh): other_build_module CC KIND OUT compiles OUT, a
# stand-in back-end module of KIND (cuda, mpi) whose identity part names another build, so a loader must refuse
# it by name and never run it.
other_build_module() {
  local cc=$1 kind=$2 out=$3
  cat > "$out.c" <<C
#include <stdint.h>
#include <string.h>
struct identity { const char* build; void (*set_log_rank)(int); };
static void set_log_rank(int rank) { (void)rank; }
static const struct identity kIdentity = {"0.0.0 Other 1 headers 0123456789abcdef", set_log_rank};
const void* strata_${kind}_module_part(const char* name, uint32_t version, uint32_t* has_version) {
  if (strcmp(name, "identity") == 0 && version == 1) return &kIdentity;
  *has_version = 0;
  return NULL;
}
C
  "$cc" -std=c99 -shared -fPIC "$out.c" -o "$out"
}
