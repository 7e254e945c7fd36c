// The C ABI on a GPU (label gpu; skips where none is visible): an engine with STRATA_DEVICE_CUDA over the
// host's own ncclComm_t (strata_comm_create_nccl) and one over an in-process comm train the same units
// with the same synthetic gradients (written through the device pointers the hooks return) to the same
// weights, bit for bit, as a host engine; a host engine over an NCCL comm is refused.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/runtime/capi/capi_test_util.h"

namespace {

using strata::capi_test::RunCRanks;
using strata::capi_test::Spec;

bool GpuVisible() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Registers "a" (w[16,8], b[8]) and "b" (w[8,3], b[3]), trains 3 steps of one micro-batch with
// g = cos(0.21 i + 0.9 s + unit + param) added into each gradient, returns every parameter gathered.
std::vector<float> Train(strata_comm* comm, int32_t device) {
  std::vector<float> all;
  strata_engine* e = nullptr;
  strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
  o.config_json = "{\"zero_optimization\": {\"stage\": 3}, \"bf16\": {\"enabled\": true}}";
  o.device = device;
  EXPECT_STRATA_OK(strata_engine_create(comm, &o, &e));
  if (e == nullptr) return all;
  const int64_t shapes[2][2][2] = {{{16, 8}, {8, 0}}, {{8, 3}, {3, 0}}};
  // Elements of parameter p of unit u.
  auto numel = [&](int u, int p) {
    return p == 0 ? size_t(shapes[u][0][0] * shapes[u][0][1]) : size_t(shapes[u][1][0]);
  };
  for (int u = 0; u < 2; ++u) {
    const strata_param_spec p[2] = {Spec("weight", shapes[u][0], 2, 1, STRATA_INIT_NORMAL, 0.02f),
                                    Spec("bias", shapes[u][1], 1, 0, STRATA_INIT_ZEROS, 0)};
    int32_t id = -1;
    EXPECT_STRATA_OK(strata_engine_register_unit(e, u == 0 ? "a" : "b", p, 2, &id));
  }
  EXPECT_STRATA_OK(strata_engine_finalize(e));
  for (int s = 0; s < 3; ++s) {
    EXPECT_STRATA_OK(strata_engine_begin_micro_batch(e));
    for (int u = 0; u < 2; ++u) {
      EXPECT_STRATA_OK(strata_engine_begin_forward(e, u, nullptr));
      EXPECT_STRATA_OK(strata_engine_end_forward(e, u));
    }
    for (int u = 1; u >= 0; --u) {
      strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
      EXPECT_STRATA_OK(strata_engine_begin_backward(e, u, &b));
      for (int p = 0; p < b.num_params; ++p) {
        const size_t n = numel(u, p);
        std::vector<float> g(n);
        if (device == STRATA_DEVICE_CUDA) {
          EXPECT_EQ(cudaMemcpy(g.data(), b.grads[p], n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        } else {
          std::memcpy(g.data(), b.grads[p], n * 4);
        }
        for (size_t i = 0; i < n; ++i) g[i] += std::cos(0.21f * float(i) + 0.9f * float(s) + float(u + p));
        if (device == STRATA_DEVICE_CUDA) {
          EXPECT_EQ(cudaMemcpy(b.grads[p], g.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        } else {
          std::memcpy(b.grads[p], g.data(), n * 4);
        }
      }
      EXPECT_STRATA_OK(strata_engine_end_backward(e, u));
    }
    EXPECT_STRATA_OK(strata_engine_end_micro_batch(e));
    strata_step_result r = STRATA_STEP_RESULT_INIT;
    EXPECT_STRATA_OK(strata_engine_step(e, &r));
  }
  for (int u = 0; u < 2; ++u) {
    for (int p = 0; p < 2; ++p) {
      const size_t n = numel(u, p);
      std::vector<float> v(n);
      EXPECT_STRATA_OK(strata_engine_gather_param(e, u, p, v.data(), n));
      all.insert(all.end(), v.begin(), v.end());
    }
  }
  EXPECT_STRATA_OK(strata_engine_destroy(e));
  return all;
}

TEST(CApiCuda, NcclAndInProcessCudaEnginesMatchTheHostEngine) {
  if (!GpuVisible()) GTEST_SKIP() << "no CUDA device visible";
  std::vector<float> host, cuda_in_process, cuda_nccl;
  RunCRanks(1, [&](int, strata_comm* comm) { host = Train(comm, STRATA_DEVICE_HOST); });
  RunCRanks(1, [&](int, strata_comm* comm) { cuda_in_process = Train(comm, STRATA_DEVICE_CUDA); });
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t theirs = nullptr;
  ASSERT_EQ(ncclCommInitRank(&theirs, 1, id, 0), ncclSuccess);
  strata_comm* comm = nullptr;
  ASSERT_STRATA_OK(strata_comm_create_nccl(theirs, &comm));
  cuda_nccl = Train(comm, STRATA_DEVICE_CUDA);
  strata_engine* e = nullptr;  // a host engine cannot use an NCCL communicator
  strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
  EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), STRATA_ERR_INVALID_ARGUMENT, "needs STRATA_DEVICE_CUDA");
  EXPECT_STRATA_OK(strata_comm_destroy(comm));
  ncclCommDestroy(theirs);  // the host's communicator outlives Strata's split of it
  ASSERT_FALSE(host.empty());
  EXPECT_EQ(host, cuda_in_process);
  EXPECT_EQ(host, cuda_nccl);
}

}  // namespace
