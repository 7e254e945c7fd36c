// Warp and block reductions of the NN kernels (kernels/cuda). Not an op.
//
// Deterministic: a fixed butterfly (xor shuffles) inside a warp and a fixed order over the warps, so the
// result depends only on the values and blockDim, never on scheduling. Every lane of a warp (and every
// thread of a block, for the block versions) gets the same bits: at each butterfly level lanes i and
// i ^ off add the same two values, and float addition is commutative.
#pragma once

#include <cuda_runtime.h>

namespace strata::kernels::cuda {

inline constexpr int kWarpThreads = 32;
inline constexpr unsigned kFullWarp = 0xffffffffu;

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
// A value ternary, as in the host's max loops: a per-thread maximum started at -inf skips NaN elements
// and so is never NaN itself, and a maximum is exact in any order, so host and device agree bit for bit.
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

template <class T, class Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
  for (int off = kWarpThreads / 2; off > 0; off /= 2) v = op(v, __shfl_xor_sync(kFullWarp, v, off));
  return v;
}

template <class T>
__device__ __forceinline__ T WarpSum(T v) {
  return WarpReduce(v, SumOp{});
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024); every thread must call it
// and every thread gets the result. `identity` fills the unused warp slots. Safe to call repeatedly.
template <class T, class Op>
__device__ T BlockReduce(T v, Op op, T identity) {
  __shared__ T warp_vals[kWarpThreads];
  const int lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  const int warps = blockDim.x / kWarpThreads;
  v = WarpReduce(v, op);
  __syncthreads();  // a previous call's readers of warp_vals are done
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  return WarpReduce(lane < warps ? warp_vals[lane] : identity, op);
}

template <class T>
__device__ __forceinline__ T BlockSum(T v) {
  return BlockReduce(v, SumOp{}, T(0));
}

__device__ __forceinline__ float BlockMax(float v) { return BlockReduce(v, MaxOp{}, -__int_as_float(0x7f800000)); }

}  // namespace strata::kernels::cuda
