// gemm.cuh: row-major GEMM on cuBLAS (cublasGemmEx, fp32 compute), used by linear and lm_head.
#pragma once
#include <cublas_v2.h>

#include "core/dtype.h"

namespace mgrl::kernels::cuda {

// cuBLAS/CUDA data type of F32, F16 or BF16.
cudaDataType_t cuda_type(DType t);

// Row-major C[M, N] = alpha * op(A) @ op(B) + beta * C with CUBLAS_COMPUTE_32F (fp32 accumulation).
//   op(A) is [M, K]: A is stored row-major [M, K] (ta = false) or [K, M] (ta = true); lda = its stored row length.
//   op(B) is [K, N]: B is stored row-major [K, N] (tb = false) or [N, K] (tb = true); ldb likewise.
//   C is row-major [M, N] with ldc.
// Types (what cublasGemmEx accepts with COMPUTE_32F): a_type == b_type in {F16, BF16, F32}; c_type == a_type or F32.
// Does nothing when M, N or K is 0 (callers handle the K == 0 case themselves).
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const void* A, DType a_type,
             int lda, const void* B, DType b_type, int ldb, float beta, void* C, DType c_type, int ldc);

}  // namespace mgrl::kernels::cuda
