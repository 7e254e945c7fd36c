// The bias kernels of the cuBLASLt products (matmul.h): the broadcast add for when cuBLASLt's bias
// epilogue is not used, and the deterministic bias gradient (Note [Deterministic bias gradient] in
// matmul_plan.h). Elements are fp32 or bf16 (uint16_t bits, element_math.h's round-to-nearest-even
// casts); arithmetic is fp32. Caller's stream, caller's memory, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "models/gpt/nn/cuda/matmul_plan.h"

namespace strata::kernels::cuda {

// out[M,N] += bias[N] on every row (out rounded once to its type); ld_out is out's row stride (>= N).
cudaError_t LaunchAddBiasRows(void* out, MatmulDtype out_type, const void* bias, MatmulDtype bias_type, int64_t M,
                              int64_t N, int64_t ld_out, cudaStream_t stream);

// dbias[N] += sum over rows of dout[M,N], in a fixed order (same bits on every run). `workspace`:
// `workspace_bytes` of device scratch (fp32 partial sums, BiasGradChunks(M, N, workspace_bytes) rows of
// N), unused by anything else until this work completes on `stream`; any size works, 0 included.
cudaError_t LaunchBiasGrad(const void* dout, MatmulDtype dout_type, void* dbias, MatmulDtype dbias_type, int64_t M,
                           int64_t N, float* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace strata::kernels::cuda
