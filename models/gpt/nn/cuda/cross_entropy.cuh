// Softmax cross-entropy on the device, the twin of models/gpt/nn/cpu/nn.h CrossEntropyForward / Backward: same
// arguments, the same per-row math (models/gpt/nn/common/nn_math.h: Exp, SoftmaxInv, CrossEntropyLoss,
// CrossEntropyGrad), the same in-place allowances (probs == logits, dlogits == probs; Note [Cross-entropy
// in place] in models/gpt/nn/cpu/nn_ops.cc) and the same NaN for a target outside [0, V).
//
// Forward: one block per row: the row max (exact in any order), exp(l - max) written to probs and summed
// in double, then probs scaled by the float reciprocal and the loss taken as log-sum-exp. Each exp is the
// host's bits; only the double sum's order differs, so probs and losses agree with the host to within an
// ulp or so. The mean, which the host returns, is written by a second one-block kernel into a device
// double (a fixed-order double sum of the row losses, divided by N; NaN for N == 0), so nothing
// synchronises. Backward: one block per row, each element (p - [j == target]) * dloss, the host's bits.
// Caller's stream, caller's memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels::cuda {

// probs[N,V] = softmax(logits); losses[N] = -log probs[target]; *mean_loss (device double) = the mean of
// losses, skipped when mean_loss == nullptr. All device pointers.
cudaError_t LaunchCrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                      int N, int V, double* mean_loss, cudaStream_t stream);

// dlogits = (probs - onehot(target)) * dloss (written); a row with an invalid target is NaN.
cudaError_t LaunchCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss,
                                       int N, int V, cudaStream_t stream);

}  // namespace strata::kernels::cuda
