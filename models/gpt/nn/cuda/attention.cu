// Reference attention kernels (see attention.cuh).
//
// Indexing: block r of a launch is row r of att viewed as [B * NH * T, T], i.e. (b, h, t) with
// r = (b * NH + h) * T + t. For token t of batch b, head h's query, key and value are the hs = C / NH
// floats at qkv + (b * T + t) * 3C + {0, C, 2C} + h * hs (Head::Qkv below).
#include "kernels/cuda/launch_util.cuh"
#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cuda/attention.cuh"
#include "models/gpt/nn/cuda/reduce_util.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr size_t kMaxGridX = 0x7fffffff;  // one block per att row

// The block's (batch, head, token) and the offsets of that head's vectors.
struct Head {
  int b, h, t;  // batch, head, the block's token
  int T, C, hs;  // sequence length, channels, head size C / NH

  // q (part 0), k (part 1) or v (part 2) of token t2: qkv + (b T + t2) 3C + part C + h hs.
  __device__ size_t Qkv(int t2, int part) const {
    return (static_cast<size_t>(b) * T + t2) * 3 * C + static_cast<size_t>(part) * C + static_cast<size_t>(h) * hs;
  }
  // The head's slice of token t2 in out / dout [B, T, C].
  __device__ size_t Out(int t2) const { return (static_cast<size_t>(b) * T + t2) * C + static_cast<size_t>(h) * hs; }
};

__device__ Head HeadOf(int T, int C, int NH) {
  const size_t r = blockIdx.x;
  return Head{static_cast<int>(r / (static_cast<size_t>(T) * NH)), static_cast<int>((r / T) % NH),
              static_cast<int>(r % T), T, C, C / NH};
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Block (b, h, t): att[t, :] = causal softmax of scale * q_t . k_t2, then out_t = sum_t2 att[t, t2] v_t2.
__global__ void AttentionForwardKernel(const float* qkv, float* out, float* att, int T, int C, int NH) {
  const Head hd = HeadOf(T, C, NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd.hs));
  const float* q = qkv + hd.Qkv(hd.t, 0);
  float* a = att + static_cast<size_t>(blockIdx.x) * T;
  float mx = -__int_as_float(0x7f800000);
  for (int t2 = threadIdx.x; t2 <= hd.t; t2 += blockDim.x) {
    a[t2] = scale * Dot(q, qkv + hd.Qkv(t2, 1), hd.hs);
    mx = MaxOp{}(mx, a[t2]);
  }
  mx = BlockMax(mx);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= hd.t; t2 += blockDim.x) {
    a[t2] = Exp(a[t2] - mx);
    sum += a[t2];
  }
  const float inv = 1.0f / BlockSum(sum);  // >= 1: the max term is exp(0)
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) a[t2] = t2 <= hd.t ? a[t2] * inv : 0.0f;
  __syncthreads();  // the whole row of att is read below
  float* o = out + hd.Out(hd.t);
  for (int d = threadIdx.x; d < hd.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= hd.t; ++t2) acc += a[t2] * qkv[hd.Qkv(t2, 2) + d];
    o[d] = acc;
  }
}

// Block (b, h, t), query side: dp[t2] = dout_t . v_t2, then the softmax backward
// ds[t2] = p[t2] (dp[t2] - sum_j p[j] dp[j]) into datt (zero above the diagonal), then
// dq_t = scale * sum_t2 ds[t2] k_t2.
__global__ void AttentionBackwardQueryKernel(const float* dout, const float* qkv, const float* att, float* dqkv,
                                             float* datt, int T, int C, int NH) {
  const Head hd = HeadOf(T, C, NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd.hs));
  const float* g = dout + hd.Out(hd.t);
  const float* p = att + static_cast<size_t>(blockIdx.x) * T;
  float* ds = datt + static_cast<size_t>(blockIdx.x) * T;
  float dot = 0.0f;
  for (int t2 = threadIdx.x; t2 <= hd.t; t2 += blockDim.x) {
    ds[t2] = Dot(g, qkv + hd.Qkv(t2, 2), hd.hs);
    dot += p[t2] * ds[t2];
  }
  dot = BlockSum(dot);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) ds[t2] = t2 <= hd.t ? p[t2] * (ds[t2] - dot) : 0.0f;
  __syncthreads();  // the whole row of ds is read below
  float* dq = dqkv + hd.Qkv(hd.t, 0);
  for (int d = threadIdx.x; d < hd.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= hd.t; ++t2) acc += ds[t2] * qkv[hd.Qkv(t2, 1) + d];
    dq[d] = scale * acc;
  }
}

// Block (b, h, t) as the key / value token, after the query kernel (stream order): the queries at or
// after t see it, so dk_t = scale * sum_{t1 >= t} ds[t1, t] q_t1 and dv_t = sum_{t1 >= t} p[t1, t] dout_t1.
__global__ void AttentionBackwardKeyValueKernel(const float* dout, const float* qkv, const float* att,
                                                float* dqkv, const float* datt, int T, int C, int NH) {
  const Head hd = HeadOf(T, C, NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd.hs));
  const size_t head_rows = static_cast<size_t>(blockIdx.x) - hd.t;  // row (b, h, 0) of att and datt
  float* dk = dqkv + hd.Qkv(hd.t, 1);
  float* dv = dqkv + hd.Qkv(hd.t, 2);
  for (int d = threadIdx.x; d < hd.hs; d += blockDim.x) {
    float acc_k = 0.0f, acc_v = 0.0f;
    for (int t1 = hd.t; t1 < T; ++t1) {
      const size_t i = (head_rows + t1) * T + hd.t;
      acc_k += datt[i] * qkv[hd.Qkv(t1, 0) + d];
      acc_v += att[i] * dout[hd.Out(t1) + d];
    }
    dk[d] = scale * acc_k;
    dv[d] = acc_v;
  }
}

}  // namespace

cudaError_t LaunchAttentionForward(const float* qkv, float* out, float* att, int B, int T, int C, int NH,
                                   cudaStream_t stream) {
  if (B <= 0 || T <= 0 || NH <= 0) return cudaSuccess;
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows > kMaxGridX) return cudaErrorInvalidConfiguration;
  AttentionForwardKernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, stream>>>(qkv, out, att, T, C, NH);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv,
                                    float* datt, int B, int T, int C, int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || NH <= 0) return cudaSuccess;
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows > kMaxGridX) return cudaErrorInvalidConfiguration;
  AttentionBackwardQueryKernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, stream>>>(dout, qkv, att, dqkv,
                                                                                          datt, T, C, NH);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  AttentionBackwardKeyValueKernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, stream>>>(dout, qkv, att, dqkv,
                                                                                             datt, T, C, NH);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
