// gemm.cpp: OpenBLAS GEMM, or the batch-invariant fixed-order kernel.
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstdint>

namespace mgrl::kernels::cpu {
namespace {
thread_local bool g_invariant = false;

// One dot product in a fixed order: 8 lanes over k (k mod 8), combined pairwise, then the tail.
inline float dot_fixed(const float* a, const float* b, int K) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) lane[j] += a[k + j] * b[k + j];
  float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; k < K; ++k) s += a[k] * b[k];
  return s;
}
}  // namespace

void set_batch_invariant(bool on) { g_invariant = on; }
bool batch_invariant() { return g_invariant; }

void gemm_nt(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta) {
  if (M <= 0 || N <= 0) return;
  if (!g_invariant) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, K, B, K, beta, C, N);
    return;
  }
  for (int m = 0; m < M; ++m) {
    const float* a = A + static_cast<int64_t>(m) * K;
    float* c = C + static_cast<int64_t>(m) * N;
    for (int n = 0; n < N; ++n) {
      const float v = alpha * dot_fixed(a, B + static_cast<int64_t>(n) * K, K);
      c[n] = beta == 0.0f ? v : v + beta * c[n];
    }
  }
}

}  // namespace mgrl::kernels::cpu
