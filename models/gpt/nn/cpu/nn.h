// Host kernels for the GPT trainer: LayerNorm, GELU (tanh), causal multi-head attention, softmax
// cross-entropy, embeddings, and the matrix products (oneDNN sgemm underneath).
//
// Conventions: fp32, row-major, callers own every buffer (nothing here allocates). Gradients of
// parameters are ACCUMULATED (+=) so tied and repeated uses add up; gradients of activations are
// WRITTEN (=), except LayerNormBackward's dx, which accumulates (it feeds the residual stream).
// Shapes: B batch, T sequence, C channels, NH heads, V vocabulary, N = B*T rows.
// Aliasing: outputs of the matrix products and attention must not overlap their inputs; the elementwise
// kernels and the cross-entropy pair may run in place (probs == logits, dlogits == probs).
// Each function is checked against a double-precision reference in tests/models/gpt/nn/cpu/nn_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu {

// ---- matrix products (row-major) ----
// out[M,N] = a[M,K] @ w[K,N] (+ bias[N] when bias != nullptr); accumulate=true adds into out.
void MatmulForward(const float* a, const float* w, const float* bias, float* out, int M, int K, int N,
                   bool accumulate = false);
// Given dout[M,N] of out = a @ w + bias:
//   da[M,K] = dout @ w^T        (written; skipped when da == nullptr)
//   dw[K,N] += a^T @ dout       (accumulated; skipped when dw == nullptr)
//   dbias[N] += sum_rows dout   (accumulated; skipped when dbias == nullptr)
void MatmulBackward(const float* dout, const float* a, const float* w, float* da, float* dw, float* dbias, int M,
                    int K, int N);
// out[M,N] = a[M,K] @ b[N,K]^T (the tied LM head: logits = x @ wte^T).
void MatmulTransBForward(const float* a, const float* b, float* out, int M, int K, int N);
// Given dout[M,N] of out = a @ b^T: da[M,K] = dout @ b (written), db[N,K] += dout^T @ a (accumulated).
// Neither da nor db may be null.
void MatmulTransBBackward(const float* dout, const float* a, const float* b, float* da, float* db, int M, int K,
                          int N);

// ---- LayerNorm over the last dimension ----
// out = (x - mean) * rstd * w + b; saves mean[N], rstd[N] for the backward.
void LayerNormForward(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd, int N,
                      int C, float eps = 1e-5f);
// dx += ..., dw += ..., db += ... (dx accumulated: it is a residual-stream gradient).
void LayerNormBackward(const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                       float* dx, float* dw, float* db, int N, int C);

// ---- GELU, tanh approximation (GPT-2's "gelu_new") ----
void GeluForward(const float* x, float* out, size_t n);
// dx = dout * gelu'(x) (written).
void GeluBackward(const float* x, const float* dout, float* dx, size_t n);

// ---- causal multi-head self-attention ----
// qkv[B,T,3C]: per token q (C), k (C), v (C), heads of size C/NH contiguous inside each (the layout of
// GPT-2's c_attn output). out[B,T,C]; att[B,NH,T,T] saves the softmax probabilities (upper triangle 0).
void AttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH);
// dqkv (written) from dout[B,T,C]; datt[B,NH,T,T] is caller-provided scratch.
void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv, float* datt, int B, int T,
                       int C, int NH);

// ---- softmax cross-entropy ----
// probs[N,V] = softmax(logits); losses[N] = -log probs[target]. Returns the mean loss (double accum;
// NaN when N == 0). A target outside [0, V) is a caller bug: that row's loss (and so the mean) is NaN.
double CrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses, int N, int V);
// dlogits = (probs - onehot(target)) * dloss (written); dloss is d(total loss)/d(row loss), e.g. 1/N.
// A row whose target is outside [0, V) is written as NaN, matching the forward.
void CrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, float dloss, int N, int V);

// ---- embeddings ----
// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int B, int T, int C);
// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t, :] += dout[b,t,:]
void EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int B, int T, int C);

// ---- elementwise ----
void AddInto(float* dst, const float* src, size_t n);  // dst += src
void Add(const float* a, const float* b, float* out, size_t n);  // out = a + b

}  // namespace strata::kernels::cpu
