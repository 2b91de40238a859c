// linear.cpp: dense layer forward and backward on top of cblas_sgemm (row-major).
#include "kernels/cpu/linear.h"

#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstdint>

namespace mgrl::kernels::cpu {

void linear_forward(float* y, const float* x, const float* W, const float* bias, int T, int in, int out) {
  if (T <= 0 || out <= 0) return;
  float beta = 0.0f;
  if (bias) {
    for (int t = 0; t < T; ++t) {
      float* yr = y + static_cast<int64_t>(t) * out;
      for (int o = 0; o < out; ++o) yr[o] = bias[o];
    }
    beta = 1.0f;
  }
  // y[T, out] (+)= x[T, in] @ W[out, in]^T
  gemm_nt(y, x, W, T, out, in, 1.0f, beta);
}

void linear_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x, const float* W, int T, int in,
                     int out, bool accumulate_dx) {
  if (T <= 0) return;
  if (dx) {
    // dx[T, in] = dy[T, out] @ W[out, in]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, out, 1.0f, dy, out, W, in,
                accumulate_dx ? 1.0f : 0.0f, dx, in);
  }
  if (dW) {
    // dW[out, in] += dy[T, out]^T @ x[T, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
  }
  if (dbias) {
    for (int t = 0; t < T; ++t) {
      const float* g = dy + static_cast<int64_t>(t) * out;
      for (int o = 0; o < out; ++o) dbias[o] += g[o];
    }
  }
}

}  // namespace mgrl::kernels::cpu
