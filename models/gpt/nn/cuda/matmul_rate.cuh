// The dense bf16 matrix-product rate of this GPU through the products of matmul.h: the reference an MFU
// figure divides by, measured in the same run as the training step it judges (shared, noisy machines).
//
// A one-off calibration, not a hot-path op: it allocates its operands (cudaMalloc) and synchronises the
// stream to read its events.
#pragma once

#include <cuda_runtime.h>

#include "models/gpt/nn/cuda/matmul.h"

namespace strata::kernels::cuda {

// Times `iters` products out[M,N] = a[M,K] @ w[K,N], all bf16 with fp32 accumulation (kMatmulBf16, no
// bias), on `stream` between two cudaEvents, after two untimed warm-up products (the first builds the
// plan). The operands hold pseudo-random values in [-1, 1) (zeros would draw less power and flatter the
// clock). On success *flops_per_s = 2 M N K iters / elapsed seconds. Blocks until the products finish.
MatmulStatus MeasureBf16MatmulFlops(MatmulContext& ctx, int M, int N, int K, int iters, cudaStream_t stream,
                                    double* flops_per_s);

}  // namespace strata::kernels::cuda
