// GELU kernels (see gelu.cuh).
#include "kernels/cuda/elementwise.cuh"
#include "models/gpt/nn/common/nn_math.h"
#include "models/gpt/nn/cuda/gelu.cuh"

namespace strata::kernels::cuda {
namespace {

struct GeluOp {
  __device__ float operator()(float x, float) const { return Gelu(x); }
};

// The host's dout * GeluGrad(x), in that order (models/gpt/nn/cpu/nn_ops.cc GeluBackward).
struct GeluGradOp {
  __device__ float operator()(float x, float dout) const { return dout * GeluGrad(x); }
};

}  // namespace

cudaError_t LaunchGeluForward(const float* x, float* out, size_t n, cudaStream_t stream) {
  return LaunchMap(x, nullptr, out, n, GeluOp{}, stream);
}

cudaError_t LaunchGeluBackward(const float* x, const float* dout, float* dx, size_t n, cudaStream_t stream) {
  return LaunchMap(x, dout, dx, n, GeluGradOp{}, stream);
}

}  // namespace strata::kernels::cuda
