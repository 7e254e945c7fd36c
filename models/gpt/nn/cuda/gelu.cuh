// GELU (tanh approximation, GPT-2's "gelu_new") on the device, forward and backward, with the host's
// element functions (models/gpt/nn/common/nn_math.h Gelu, GeluGrad), so every element is the host kernel's bits
// (models/gpt/nn/cpu/nn.h GeluForward / GeluBackward; this library builds with --fmad=false). 16-byte accesses
// where aligned, grid-stride, caller's stream, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda {

// out[i] = gelu(x[i]) for i < n (device pointers; out == x allowed).
cudaError_t LaunchGeluForward(const float* x, float* out, size_t n, cudaStream_t stream);

// dx[i] = dout[i] * gelu'(x[i]) (written; dx may be x or dout).
cudaError_t LaunchGeluBackward(const float* x, const float* dout, float* dx, size_t n, cudaStream_t stream);

}  // namespace strata::kernels::cuda
