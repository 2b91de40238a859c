// gemm.cu: row-major GEMM on cuBLAS (cublasGemmEx, fp32 compute), used by linear and lm_head.
#include "kernels/cuda/gemm.cuh"

#include <string>

#include "core/check_cuda.h"

namespace mgrl::kernels::cuda {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      break;
  }
  MGRL_CHECK(false, std::string("no cuBLAS type for dtype ") + dtype_name(t));
  return CUDA_R_32F;
}

void gemm_rm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const void* A, DType a_type,
             int lda, const void* B, DType b_type, int ldb, float beta, void* C, DType c_type, int ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  // cuBLAS is column-major. A row-major matrix X[r, c] with row length ld is, read column-major, X^T [c, r]
  // with the same ld. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so we ask cuBLAS for
  //   C^T[N, M] = op'(B) [N, K] @ op'(A) [K, M]
  // where B's column-major view is B_stored^T: op(B) = B_stored (tb false) makes op(B)^T exactly that view
  // (CUBLAS_OP_N); op(B) = B_stored^T (tb true) needs the view transposed (CUBLAS_OP_T). Same for A.
  // Example, linear forward y[T, out] = x[T, in] @ W[out, in]^T (ta = false, tb = true, M = T, N = out, K = in):
  //   cublasGemmEx(h, OP_T, OP_N, out, T, in, W, ld in, x, ld in, y, ld out).
  const cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasGemmEx(h, opB, opA, N, M, K, &alpha, B, cuda_type(b_type), ldb, A, cuda_type(a_type), lda, &beta,
                            C, cuda_type(c_type), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace mgrl::kernels::cuda
