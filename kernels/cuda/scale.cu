// Scale kernel (see scale.cuh).
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/scale.cuh"

namespace strata::kernels::cuda {
namespace {

struct ScaleOp {
  float s;
  __device__ float operator()(float x, float) const { return x * s; }
};

}  // namespace

cudaError_t LaunchScale(const float* x, float* y, size_t n, float s, cudaStream_t stream) {
  return LaunchMap(x, nullptr, y, n, ScaleOp{s}, stream);
}

}  // namespace strata::kernels::cuda
