/* strata.h compiles as C99 (built with -std=c99 -pedantic-errors -Wall -Wextra -Werror) and works from C:
 * the initializer macros fill struct_size and version, and an error comes back as a code plus a message
 * naming the function. Exits 0 on success. */
#include <stdio.h>
#include <string.h>
#include <strata/strata.h>

static int failures = 0;

#define EXPECT(cond)                                             \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                \
    }                                                            \
  } while (0)

int main(void) {
  strata_engine_options options = STRATA_ENGINE_OPTIONS_INIT;
  strata_param_spec spec = STRATA_PARAM_SPEC_INIT;
  strata_param_info info = STRATA_PARAM_INFO_INIT;
  strata_unit_buffers buffers = STRATA_UNIT_BUFFERS_INIT;
  strata_step_result result = STRATA_STEP_RESULT_INIT;
  strata_stats stats = STRATA_STATS_INIT;
  strata_comm* comm = NULL;
  strata_engine* engine = NULL;
  EXPECT(options.struct_size == sizeof options && options.version == STRATA_ABI_VERSION);
  EXPECT(options.config_json == NULL && options.device == STRATA_DEVICE_HOST);
  EXPECT(spec.struct_size == sizeof spec && spec.version == STRATA_ABI_VERSION && spec.init == STRATA_INIT_ZEROS);
  EXPECT(info.struct_size == sizeof info && buffers.struct_size == sizeof buffers);
  EXPECT(result.struct_size == sizeof result && stats.struct_size == sizeof stats);
  EXPECT(strata_abi_version() == STRATA_ABI_VERSION);

  EXPECT(strata_comm_create_in_process(1, &comm) == STRATA_OK);
  options.config_json = "{\"zero_optimization\": {\"stage\": 9}}";
  EXPECT(strata_engine_create(comm, &options, &engine) == STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(engine == NULL);
  EXPECT(strstr(strata_last_error(), "strata_engine_create: ") == strata_last_error());
  EXPECT(strstr(strata_last_error(), "zero_optimization.stage") != NULL);
  options.config_json = NULL;
  EXPECT(strata_engine_create(comm, &options, &engine) == STRATA_OK);
  EXPECT(strcmp(strata_last_error(), "") == 0);
  EXPECT(strata_engine_begin_forward(engine, 0, &buffers) == STRATA_ERR_FAILED_PRECONDITION);
  EXPECT(strata_engine_destroy(engine) == STRATA_OK);
  EXPECT(strata_comm_destroy(comm) == STRATA_OK);
  if (failures == 0) printf("strata.h as C99: ok\n");
  return failures == 0 ? 0 : 1;
}
