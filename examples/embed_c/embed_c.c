/* embed_c: trains the MLP of examples/mlp through Strata's C ABI alone (plain C99, <strata/strata.h>).
 *
 *   mpirun -n 2 embed_c [--dump FILE]
 *
 * Same units, shapes, initialisation, data and loss as mlp_train (x -> tanh(L0) -> tanh(L1) -> tanh(L1,
 * tied) -> L2), ZeRO-3, 60 steps of 16 samples split over the ranks. Evaluates a fixed held-out set before
 * and after (evaluation forwards outside micro-batches) and exits 0 when the loss fell. --dump writes the
 * final fp32 parameters (mlp_train --dump format) so tests can compare with the C++ trainer. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strata/strata.h>

enum { IN = 16, HID = 48, OUT = 4, STEPS = 60, BATCH = 16, EVAL = 32, MAXB = 32 };
/* Printed on rank 0 with the schedule, so a test can hand the identical run to mlp_train. */
static const char kConfig[] = "{\"zero_optimization\": {\"stage\": 3}, \"strata\": {\"seed\": 7}, "
                              "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}";
static int rank = 0, world = 1;
static int32_t units[3]; /* input, hidden (used twice per pass), output */

#define CHECK(call)                                                                                      \
  do {                                                                                                   \
    strata_status s_ = (call);                                                                           \
    if (s_ != STRATA_OK) {                                                                               \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #call, strata_last_error(), strata_status_name(s_)); \
      return s_;                                                                                         \
    }                                                                                                    \
  } while (0)

/* Sample `index` exactly as Mlp::Sample: x uniform in (-1, 1) from the runtime's SplitMix64 stream,
 * targets from a fixed smooth teacher. */
static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static void sample(int64_t index, float* x, float* t) {
  int i, o;
  for (i = 0; i < IN; ++i) {
    const uint64_t key = (uint64_t)index * 1315423911ull + (uint64_t)i * 2654435761ull;
    const double u = ((double)(splitmix64(splitmix64(12345ull ^ key)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    x[i] = 2.0f * (float)((2.0 * u - 1.0) * 0.5f);
  }
  for (o = 0; o < OUT; ++o) {
    float acc = 0;
    for (i = 0; i < IN; ++i) acc += sinf(0.7f * (o + 1) + 0.3f * i) * x[i];
    t[o] = sinf(acc);
  }
}

/* z = tanh?(W x + b) over a batch, in mlp_model.cc's summation order. */
static void linear(const strata_unit_buffers* u, const float* x, int n, int in, int out, int act, float* z) {
  const float* w = (const float*)u->params[0];
  const float* b = (const float*)u->params[1];
  int s, o, i;
  for (s = 0; s < n; ++s)
    for (o = 0; o < out; ++o) {
      float acc = b[o];
      for (i = 0; i < in; ++i) acc += w[o * in + i] * x[s * in + i];
      z[s * out + o] = act ? tanhf(acc) : acc;
    }
}

/* Given dz: dW += dz^T x, db += sum dz (ADD: the engine's contract), and dx = dz W when dx != NULL. */
static void linear_backward(const strata_unit_buffers* u, const float* x, const float* dz, int n, int in, int out,
                            float* dx) {
  const float* w = (const float*)u->params[0];
  float *dw = u->grads[0], *db = u->grads[1];
  int s, o, i;
  for (s = 0; s < n; ++s)
    for (o = 0; o < out; ++o) {
      db[o] += dz[s * out + o];
      for (i = 0; i < in; ++i) dw[o * in + i] += dz[s * out + o] * x[s * in + i];
    }
  if (dx == NULL) return;
  memset(dx, 0, sizeof(float) * (size_t)(n * in));
  for (s = 0; s < n; ++s)
    for (o = 0; o < out; ++o)
      for (i = 0; i < in; ++i) dx[s * in + i] += dz[s * out + o] * w[o * in + i];
}

static strata_status register_model(strata_engine* e) {
  static const char* names[3] = {"input", "hidden", "output"};
  static const int64_t shapes[3][2][2] = {{{HID, IN}, {HID, 0}}, {{HID, HID}, {HID, 0}}, {{OUT, HID}, {OUT, 0}}};
  int k, p;
  for (k = 0; k < 3; ++k) {
    strata_param_spec spec[2] = {STRATA_PARAM_SPEC_INIT, STRATA_PARAM_SPEC_INIT};
    for (p = 0; p < 2; ++p) {
      spec[p].name = p == 0 ? "weight" : "bias";
      spec[p].shape = shapes[k][p];
      spec[p].ndim = p == 0 ? 2 : 1;
      spec[p].weight_decay = p == 0;
      spec[p].init = STRATA_INIT_UNIFORM;
      spec[p].init_value = 1.0f / sqrtf((float)shapes[k][0][1]);
    }
    CHECK(strata_engine_register_unit(e, names[k], spec, 2, &units[k]));
  }
  return strata_engine_finalize(e);
}

/* Forward (and, when train, backward) on samples [first, first + n); *loss = their mean loss. The four uses
 * of units: input (act 0 -> 1), hidden (1 -> 2), hidden again, tied (2 -> 3), output (3 -> 4 = y). */
static strata_status pass(strata_engine* e, int64_t first, int n, int train, double* loss) {
  static const int use_unit[4] = {0, 1, 1, 2}, dim[5] = {IN, HID, HID, HID, OUT};
  static float act[5][MAXB * HID], grad[5][MAXB * HID], t[MAXB * OUT];
  strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
  int k, i;
  for (i = 0; i < n; ++i) sample(first + i, &act[0][i * IN], &t[i * OUT]);
  for (k = 0; k < 4; ++k) {
    CHECK(strata_engine_begin_forward(e, units[use_unit[k]], &b));
    if (b.param_dtype != STRATA_DTYPE_F32) return STRATA_ERR_UNIMPLEMENTED; /* this example computes in fp32 */
    linear(&b, act[k], n, dim[k], dim[k + 1], k < 3, act[k + 1]);
    CHECK(strata_engine_end_forward(e, units[use_unit[k]]));
  }
  for (*loss = 0, i = 0; i < n * OUT; ++i) {
    const float d = act[4][i] - t[i];
    *loss += 0.5 * (double)d * d;
    grad[4][i] = d / (float)n; /* the gradient of the mean loss */
  }
  *loss /= n;
  for (k = 3; train && k >= 0; --k) { /* in reverse order of use */
    if (k < 3) /* through tanh: dz = dh * (1 - h^2) */
      for (i = 0; i < n * dim[k + 1]; ++i) grad[k + 1][i] *= 1.0f - act[k + 1][i] * act[k + 1][i];
    CHECK(strata_engine_begin_backward(e, units[use_unit[k]], &b));
    linear_backward(&b, act[k], grad[k + 1], n, dim[k], dim[k + 1], k > 0 ? grad[k] : NULL);
    CHECK(strata_engine_end_backward(e, units[use_unit[k]]));
  }
  return STRATA_OK;
}

/* Collective: every parameter in registration order; rank 0 prints a checksum and writes `path`. */
static strata_status dump(strata_engine* e, const char* path) {
  static float all[HID * IN + HID + HID * HID + HID + OUT * HID + OUT];
  size_t used = 0;
  double sum = 0;
  int k, p;
  FILE* f;
  for (k = 0; k < 3; ++k)
    for (p = 0; p < 2; ++p) {
      strata_param_info info = STRATA_PARAM_INFO_INIT;
      CHECK(strata_engine_param_info(e, units[k], p, &info));
      CHECK(strata_engine_gather_param(e, units[k], p, all + used, (size_t)info.numel));
      used += (size_t)info.numel;
    }
  for (k = 0; k < (int)used; ++k) sum += all[k];
  if (rank == 0) printf("params: %zu values, sum %.9g\n", used, sum);
  if (rank != 0 || path == NULL) return STRATA_OK;
  f = fopen(path, "wb");
  if (f == NULL || fwrite(all, sizeof(float), used, f) != used || fclose(f) != 0) return STRATA_ERR_IO;
  return STRATA_OK;
}

static strata_status train(strata_comm* comm, strata_engine** e, const char* dump_path, int* learned) {
  strata_engine_options opts = STRATA_ENGINE_OPTIONS_INIT;
  strata_step_result r = STRATA_STEP_RESULT_INIT;
  strata_stats st = STRATA_STATS_INIT;
  const int micro = BATCH / world;
  double before, after, loss;
  int step;
  opts.config_json = kConfig;
  CHECK(strata_engine_create(comm, &opts, e));
  CHECK(register_model(*e));
  CHECK(pass(*e, 1000000, EVAL, 0, &before)); /* held-out samples, the same on every rank */
  for (step = 0; step < STEPS; ++step) {
    CHECK(strata_engine_zero_grad(*e)); /* a no-op check: the engine zeroes after every step */
    CHECK(strata_engine_begin_micro_batch(*e));
    CHECK(pass(*e, (int64_t)step * BATCH + (int64_t)rank * micro, micro, 1, &loss));
    CHECK(strata_engine_end_micro_batch(*e));
    CHECK(strata_engine_step(*e, &r));
    if (rank == 0 && (step % 10 == 0 || step == STEPS - 1))
      printf("step %3lld  rank-0 loss %.6f  grad_norm %.4f  lr %.3g\n", (long long)r.step, loss, r.grad_norm, r.lr);
  }
  CHECK(pass(*e, 1000000, EVAL, 0, &after));
  CHECK(strata_engine_get_stats(*e, &st));
  if (rank == 0)
    printf("eval loss %.6f -> %.6f; device peak %llu bytes; last step %.3f ms (compute %.3f, exposed comm %.3f, "
           "optimizer %.3f, other %.3f)\n", before, after, (unsigned long long)st.device_peak_bytes, st.last_step_ms,
           st.last_compute_ms, st.last_exposed_comm_ms, st.last_optimizer_ms, st.last_other_ms);
  *learned = after < 0.8 * before;
  return dump(*e, dump_path);
}

int main(int argc, char** argv) {
  const char* dump_path = argc == 3 && strcmp(argv[1], "--dump") == 0 ? argv[2] : NULL;
  strata_comm* comm = NULL;
  strata_engine* engine = NULL;
  strata_status s;
  int learned = 0;
  if (argc != 1 && dump_path == NULL) {
    fprintf(stderr, "usage: embed_c [--dump FILE]\n");
    return 2;
  }
  if (strata_comm_create_mpi_world(&comm) != STRATA_OK) {
    fprintf(stderr, "embed_c: %s\n", strata_last_error());
    return 1;
  }
  strata_comm_rank(comm, &rank);
  strata_comm_size(comm, &world);
  if (rank == 0) printf("config: %s\nschedule: --steps %d --global-batch %d\n", kConfig, STEPS, BATCH);
  s = BATCH % world == 0 ? train(comm, &engine, dump_path, &learned) : STRATA_ERR_INVALID_ARGUMENT;
  if (s != STRATA_OK) strata_comm_abort(comm, "embed_c failed"); /* the others would wait for a timeout */
  if (rank == 0 && !learned) fprintf(stderr, "embed_c: the evaluation loss did not fall by 20%%\n");
  strata_engine_destroy(engine);
  strata_comm_destroy(comm);
  return s == STRATA_OK && learned ? 0 : 1;
}
