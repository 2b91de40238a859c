// lora.cpp: LoRA forward (saves x @ A^T) and backward (dA, dB, added dx) on top of cblas_sgemm.
#include "kernels/cpu/lora.h"

#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstdint>
#include <vector>

namespace mgrl::kernels::cpu {

void lora_forward(float* y, float* xa, const float* x, const float* A, const float* B, float scale, int T, int in,
                  int r, int out) {
  if (T <= 0 || r <= 0) return;
  // xa[T, r] = x[T, in] @ A[r, in]^T
  gemm_nt(xa, x, A, T, r, in, 1.0f, 0.0f);
  // y[T, out] += scale * xa[T, r] @ B[out, r]^T
  gemm_nt(y, xa, B, T, out, r, scale, 1.0f);
}

void lora_backward(float* dx, float* dA, float* dB, const float* dy, const float* x, const float* xa, const float* A,
                   const float* B, float scale, int T, int in, int r, int out, float* scratch) {
  if (T <= 0 || r <= 0) return;
  if (dB) {
    // dB[out, r] += scale * dy[T, out]^T @ xa[T, r]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, r, T, scale, dy, out, xa, r, 1.0f, dB, r);
  }
  if (!dA && !dx) return;
  std::vector<float> own;
  if (!scratch) {
    own.resize(static_cast<size_t>(T) * static_cast<size_t>(r));
    scratch = own.data();
  }
  float* dxa = scratch;
  // dxa[T, r] = scale * dy[T, out] @ B[out, r]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, r, out, scale, dy, out, B, r, 0.0f, dxa, r);
  if (dA) {
    // dA[r, in] += dxa[T, r]^T @ x[T, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, T, 1.0f, dxa, r, x, in, 1.0f, dA, in);
  }
  if (dx) {
    // dx[T, in] += dxa[T, r] @ A[r, in]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, r, 1.0f, dxa, r, A, in, 1.0f, dx, in);
  }
}

}  // namespace mgrl::kernels::cpu
