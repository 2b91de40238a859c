// gemm.cuh: row-major GEMM on cuBLAS (cublasGemmEx, fp32 compute), used by linear and lm_head; the biased GEMM
// of linear layers on cuBLASLt (the bias in the epilogue).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"

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

// The cuBLASLt state of one Ops (its handle, a workspace of kLtWorkspaceBytes, the plans by shape and alignment).
// Created with the Ops (allocates: never inside a step), destroyed with it.
inline constexpr std::size_t kLtWorkspaceBytes = 32u << 20;
LtState* lt_create();
void lt_destroy(LtState* lt);

// Row-major y[M, N] = x[M, K] @ W[N, K]^T + bias[N] (x, W, bias, y in `type`, F16 or BF16), the bias added in
// cuBLASLt's epilogue: fp32 accumulation plus the bias, rounded once, as a bias broadcast into y followed by a
// beta = 1 GEMM computes, without that pass over y. False (nothing queued) when cuBLASLt has no algorithm for the
// shape and alignments or refuses the call: the caller then broadcasts. M, N, K > 0.
bool gemm_bias_rm(LtState* lt, cudaStream_t s, int M, int N, int K, const void* x, const void* W, const void* bias,
                  void* y, DType type);

}  // namespace mgrl::kernels::cuda
