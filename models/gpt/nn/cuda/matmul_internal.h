// Internal to strata_gpt_cublas (matmul.cc, matmul_rate.cu): how its functions build failing
// MatmulStatus values and wrap CUDA runtime calls at the call site (the status names the call, file:line
// and CUDA's error name and text).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "models/gpt/nn/cuda/matmul.h"

namespace strata::kernels::cuda::internal {

MatmulStatus MatmulFailure(MatmulCode code, int foreign_code, std::string message);
MatmulStatus CudaFailure(const char* call, cudaError_t err, const char* file, int line);

}  // namespace strata::kernels::cuda::internal

#define STRATA_MM_CUDA_CALL(call)                                                                       \
  do {                                                                                                  \
    const cudaError_t strata_mm_err_ = (call);                                                          \
    if (strata_mm_err_ != cudaSuccess) {                                                                \
      return ::strata::kernels::cuda::internal::CudaFailure(#call, strata_mm_err_, __FILE__, __LINE__); \
    }                                                                                                   \
  } while (0)

#define STRATA_MM_RETURN_IF_ERROR(expr)                               \
  do {                                                                \
    ::strata::kernels::cuda::MatmulStatus strata_mm_status_ = (expr); \
    if (!strata_mm_status_.ok()) return strata_mm_status_;            \
  } while (0)
