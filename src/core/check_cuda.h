// check_cuda.h: CUDA_CHECK and CUBLAS_CHECK, members of the check-macro family (core/error.h).
// Include only from code built with the CUDA backend.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t mgrl_err_ = (expr);                                                          \
    if (mgrl_err_ != cudaSuccess)                                                                 \
      ::mgrl::check_failed("CUDA", #expr, cudaGetErrorString(mgrl_err_), __FILE__, __LINE__);      \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronising.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(expr)                                                                        \
  do {                                                                                            \
    const cublasStatus_t mgrl_st_ = (expr);                                                        \
    if (mgrl_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::mgrl::check_failed("cuBLAS", #expr, cublasGetStatusString(mgrl_st_), __FILE__, __LINE__);  \
  } while (0)
