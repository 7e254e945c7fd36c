// Token + position embeddings on the device, the twin of models/gpt/nn/cpu/nn.h EmbeddingForward / Backward:
// same arguments, the same accumulate contract (dwte, dwpe accumulated), and the host's bits: every
// output element sees the same float additions in the same order as on the host.
//
// Note [Deterministic embedding backward]
// dwte[tok, :] += dout[row, :] for every row, where a token may repeat anywhere in the batch. Float
// atomics would make the sum order (and so the bits) vary run to run; one block per vocabulary row
// (V = 50257) would scan every token 50257 times; a device sort of (token, row) pairs needs workspace
// and a radix-sort library. Instead each thread owns one channel c and one bucket of the vocabulary
// (tokens with tok % kEmbeddingBuckets == bucket) and walks all N tokens in row order, adding the rows
// of its bucket's tokens into dwte[tok, c]: no two threads ever touch the same element, and each element
// receives its additions in row order, exactly as the host loop does. The token ids are staged through
// shared memory a tile at a time (every thread of a block reads the same ids), and a bucket's test is
// uniform across the block, so there is no divergence. Cost: ceil(C / 256) * kEmbeddingBuckets blocks,
// each reading all N token ids once plus its share of dout; the dependent read-modify-writes of a
// thread number about N / kEmbeddingBuckets. dwpe[t, c] is one thread per element summing its B rows
// in batch order.
// Caller's stream, no allocation, no synchronisation. Token ids must lie in [0, V) (as on the host,
// where an id outside it is out of bounds); on the device a negative id is skipped.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels::cuda {

inline constexpr int kEmbeddingBuckets = 128;

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :] (device pointers).
cudaError_t LaunchEmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B,
                                   int T, int C, cudaStream_t stream);

// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t, :] += dout[b,t,:] (Note [Deterministic embedding backward]).
cudaError_t LaunchEmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B,
                                    int T, int C, cudaStream_t stream);

}  // namespace strata::kernels::cuda
