// gemm.cu: row-major GEMM on cuBLAS (cublasGemmEx, fp32 compute), used by linear and lm_head; the biased GEMM of
// linear layers on cuBLASLt.
#include "kernels/cuda/gemm.cuh"

#include <cublasLt.h>

#include <cstdint>
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

namespace {

// The largest power of two (at most 256) dividing a pointer's address: the alignment cuBLASLt may assume.
std::uint32_t alignment_of(const void* p) {
  const auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// One shape's plan: descriptors and the algorithm cuBLASLt's heuristic chose (or none).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};

}  // namespace

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // (M, N, K, type, alignments of x, W, bias, y: cuBLASLt has no preference for the bias's, so it is only part of the
  // key, a plan reused for pointers aligned alike) and its plan, in a vector searched linearly: a model has a few
  // dozen biased shapes (not a std::map: nvcc 11.8 with clang-14 and libstdc++ 12 cannot compile its emplace)
  using Key = std::tuple<int, int, int, int, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;
  std::vector<std::pair<Key, LtPlan>> plans;
};

LtState* lt_create() {
  auto* lt = new LtState;
  if (cublasLtCreate(&lt->handle) != CUBLAS_STATUS_SUCCESS) {
    delete lt;
    MGRL_CHECK(false, "cublasLtCreate failed");
  }
  if (cudaMalloc(&lt->workspace, kLtWorkspaceBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cublasLtDestroy(lt->handle);
    delete lt;
    MGRL_CHECK(false, "no device memory for cuBLASLt's workspace (" + std::to_string(kLtWorkspaceBytes >> 20) +
                          " MiB)");
  }
  return lt;
}

void lt_destroy(LtState* lt) {
  if (!lt) return;
  for (auto& kp : lt->plans) {
    LtPlan& p = kp.second;
    if (p.op) (void)cublasLtMatmulDescDestroy(p.op);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
      if (l) (void)cublasLtMatrixLayoutDestroy(l);
  }
  (void)cudaFree(lt->workspace);
  (void)cublasLtDestroy(lt->handle);
  delete lt;
}

bool gemm_bias_rm(LtState* lt, cudaStream_t s, int M, int N, int K, const void* x, const void* W, const void* bias,
                  void* y, DType type) {
  if (!lt || M <= 0 || N <= 0 || K <= 0 || (type != DType::BF16 && type != DType::F16)) return false;
  const std::uint32_t ax = alignment_of(x), aw = alignment_of(W), ab = alignment_of(bias), ay = alignment_of(y);
  const auto key = std::make_tuple(M, N, K, static_cast<int>(type), ax, aw, ab, ay);
  auto it = std::find_if(lt->plans.begin(), lt->plans.end(), [&key](const auto& kp) { return kp.first == key; });
  if (it == lt->plans.end()) {
    // Column-major, as gemm_rm: y^T [N, M] = op(W^T) [N, K] @ x^T [K, M], W^T stored [K, N] (ld K) and transposed,
    // x^T stored [K, M] (ld K); the bias runs along D's rows (N), broadcast over its M columns.
    LtPlan p;
    const cudaDataType_t t = cuda_type(type);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    bool built = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
                         CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
                         CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) ==
                         CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t) ==
                         CUBLAS_STATUS_SUCCESS;
    // The heuristic takes the bias's alignment from this pointer (cublasLt.h, BIAS_POINTER); left null it would
    // assume any alignment and might pick an algorithm that a bias aligned to less (the key's ab) cannot use.
    built = built && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ==
                         CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatrixLayoutCreate(&p.a, t, K, N, K) == CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatrixLayoutCreate(&p.b, t, K, M, K) == CUBLAS_STATUS_SUCCESS;
    built = built && cublasLtMatrixLayoutCreate(&p.d, t, N, M, N) == CUBLAS_STATUS_SUCCESS;
    if (built) {
      cublasLtMatmulPreference_t pref = nullptr;
      if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
        const std::size_t ws = kLtWorkspaceBytes;
        bool set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof ws) == CUBLAS_STATUS_SUCCESS;
        const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, aw},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, ax},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ay},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ay}};
        for (const auto& [attr, v] : aligns)
          set = set && cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        if (set && cublasLtMatmulAlgoGetHeuristic(lt->handle, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found) ==
                       CUBLAS_STATUS_SUCCESS &&
            found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
          p.algo = result.algo;
          p.ok = true;
        }
        (void)cublasLtMatmulPreferenceDestroy(pref);
      }
    }
    lt->plans.push_back({key, p});
    it = lt->plans.end() - 1;
  }
  LtPlan& p = it->second;
  if (!p.ok) return false;
  if (cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
      CUBLAS_STATUS_SUCCESS)
    return false;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(lt->handle, p.op, &alpha, W, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo, lt->workspace,
                        kLtWorkspaceBytes, s) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace mgrl::kernels::cuda
