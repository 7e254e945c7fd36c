// Causal multi-head self-attention on the device, the twin of models/gpt/nn/cpu/nn.h AttentionForward /
// AttentionBackward: the same qkv[B,T,3C] / out[B,T,C] / att[B,NH,T,T] layouts, att saving the softmax
// probabilities with exact zeros above the diagonal, dqkv written, datt caller-provided scratch.
//
// This is the plain reference kernel, clarity over speed: one thread block per (batch, head, query
// row) for the forward and the query side of the backward, one per (batch, head, key row) for the key /
// value side, each a few loops over the row with block reductions (reduce_util.cuh), no tiling, no
// tensor cores, no atomics (deterministic). A faster path (cuDNN SDPA) is to be checked against it.
// The softmax uses the host's Exp (models/gpt/nn/common/nn_math.h); dot products run in a different order
// from the host's sgemm, so results agree with the host to rounding.
// Caller's stream, caller's memory, no synchronisation. Outputs must not overlap inputs; C % NH == 0.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels::cuda {

// out = softmax(causal(q k^T / sqrt(C / NH))) v per head; att keeps the probabilities (device pointers).
cudaError_t LaunchAttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH,
                                   cudaStream_t stream);

// dqkv (written) from dout[B,T,C] and the forward's att; datt[B,NH,T,T] is scratch (its contents on
// return: d(scores) / scale, zero above the diagonal, as on the host).
cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv,
                                    float* datt, int B, int T, int C, int NH, cudaStream_t stream);

}  // namespace strata::kernels::cuda
