// Elementwise maps of the CUDA kernels: out[i] = op(a[i], b[i]), grid-stride, 16-byte accesses where
// the arrays share an alignment phase (launch_util.cuh), element by element otherwise. Not an op:
// scale.cu, gelu.cu and add.cu instantiate it with their element functions. Include it only from .cu
// files (it defines a kernel template).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/launch_util.cuh"

namespace strata::kernels::cuda {

// b == nullptr makes the map unary: op receives a[i] twice. out may be a or b (each element is read by
// the thread that writes it, before it writes it); other overlaps are not allowed.
template <class Op>
__global__ void MapKernel(const float* a, const float* b, float* out, size_t n, VectorSplit sp, Op op) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = tid; j < sp.vecs; j += stride) {
    const size_t i = sp.head + j * kVec;
    const Float8 x = Load8(a + i);
    const Float8 y = b != nullptr ? Load8(b + i) : x;
    Float8 r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.v[k] = op(x.v[k], y.v[k]);
    Store8(out + i, r);
  }
  const size_t rest = sp.head + sp.vecs * kVec;
  for (size_t k = tid; k < sp.head + (n - rest); k += stride) {
    const size_t i = k < sp.head ? k : rest + (k - sp.head);
    out[i] = op(a[i], b != nullptr ? b[i] : a[i]);
  }
}

// Launches MapKernel over [0, n) on `stream`; returns the launch error (cudaSuccess for n == 0).
template <class Op>
cudaError_t LaunchMap(const float* a, const float* b, float* out, size_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int phases[3] = {AlignedPhase(a, 4), AlignedPhase(b, 4), AlignedPhase(out, 4)};
  const size_t periods[3] = {4, 4, 4};
  size_t head = 0;
  const VectorSplit sp = SplitFor(n, CommonHead(phases, periods, 3, &head), head);
  MapKernel<<<GridFor(sp.vecs > 0 ? sp.vecs : n), kBlockThreads, 0, stream>>>(a, b, out, n, sp, op);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
