// strata.h compiles as C++11 (built with -std=c++11 -pedantic-errors -Wall -Wextra -Werror, without
// GoogleTest, which needs a newer standard): the declarations have C linkage and the initializer macros
// are valid aggregate initializers in C++. Exits 0 on success.
#include <strata/strata.h>

#include <cstdio>
#include <cstring>
#include <type_traits>

static_assert(std::is_same<strata_status, int32_t>::value, "strata_status is a fixed-width int");
static_assert(std::is_standard_layout<strata_stats>::value, "ABI structs are standard layout");

int main() {
  int failures = 0;
  const strata_engine_options options = STRATA_ENGINE_OPTIONS_INIT;
  const strata_param_spec spec = STRATA_PARAM_SPEC_INIT;
  const strata_param_info info = STRATA_PARAM_INFO_INIT;
  const strata_unit_buffers buffers = STRATA_UNIT_BUFFERS_INIT;
  const strata_step_result result = STRATA_STEP_RESULT_INIT;
  const strata_stats stats = STRATA_STATS_INIT;
  failures += options.struct_size != sizeof options || spec.struct_size != sizeof spec;
  failures += info.struct_size != sizeof info || buffers.struct_size != sizeof buffers;
  failures += result.struct_size != sizeof result || stats.struct_size != sizeof stats;
  failures += stats.version != STRATA_ABI_VERSION;
  // C linkage: the function's address has the C function type.
  strata_status (*finalize)(strata_engine*) = &strata_engine_finalize;
  failures += finalize(nullptr) != STRATA_ERR_INVALID_ARGUMENT;
  failures += std::strstr(strata_last_error(), "strata_engine_finalize: engine is NULL") == nullptr;
  if (failures == 0) std::printf("strata.h as C++11: ok\n");
  return failures == 0 ? 0 : 1;
}
