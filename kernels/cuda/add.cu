// Add kernels (see add.cuh).
#include "kernels/cuda/add.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace strata::kernels::cuda {
namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace

cudaError_t LaunchAddInto(float* dst, const float* src, size_t n, cudaStream_t stream) {
  return LaunchMap(dst, src, dst, n, AddOp{}, stream);
}

cudaError_t LaunchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t stream) {
  return LaunchMap(a, b, out, n, AddOp{}, stream);
}

}  // namespace strata::kernels::cuda
