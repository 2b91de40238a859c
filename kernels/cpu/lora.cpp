// lora.cpp: LoRA forward (saves x @ A^T) and backward (dA, dB, added dx) on top of cblas_sgemm, one adapter or a
// group of adapters sharing x (A stacked in scratch); an adapter merged into its weight (plain loops).
#include "kernels/cpu/lora.h"

#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

namespace {

// The caller's scratch, or one of the right size allocated here.
float* group_scratch(float* scratch, std::vector<float>& own, int T, int in, int r, int n) {
  if (scratch) return scratch;
  own.resize(lora_group_scratch_floats(T, in, r, n));
  return own.data();
}

// S[n r, in] = [A_1; ..; A_n]
void stack_A(float* S, const LoraMember* g, int n, int in, int r) {
  const std::size_t block = static_cast<std::size_t>(r) * static_cast<std::size_t>(in);
  for (int m = 0; m < n; ++m) std::memcpy(S + m * block, g[m].A, block * sizeof(float));
}

}  // namespace

void lora_group_forward(const LoraMember* g, int n, const float* x, int T, int in, int r, float* scratch) {
  if (T <= 0 || r <= 0 || n <= 0) return;
  std::vector<float> own;
  scratch = group_scratch(scratch, own, T, in, r, n);
  const int nr = n * r;
  float* P = scratch;                                              // [T, n r]
  float* S = scratch + static_cast<std::size_t>(T) * static_cast<std::size_t>(nr);  // [n r, in]
  stack_A(S, g, n, in, r);
  // P[T, n r] = x[T, in] @ S[n r, in]^T
  gemm_nt(P, x, S, T, nr, in, 1.0f, 0.0f);
  for (int m = 0; m < n; ++m) {
    for (int t = 0; t < T; ++t)
      std::memcpy(g[m].xa + static_cast<std::size_t>(t) * r, P + static_cast<std::size_t>(t) * nr + m * r,
                  static_cast<std::size_t>(r) * sizeof(float));
    // y_m[T, out] += scale_m * xa_m[T, r] @ B_m[out, r]^T
    gemm_nt(static_cast<float*>(g[m].y), g[m].xa, g[m].B, T, g[m].out, r, g[m].scale, 1.0f);
  }
}

void lora_group_backward(float* dx, const LoraMember* g, int n, const float* x, int T, int in, int r, float* scratch) {
  if (T <= 0 || r <= 0 || n <= 0) return;
  bool any_dA = false;
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    any_dA = any_dA || M.dA;
    // dB_m[out, r] += scale_m * dy_m[T, out]^T @ xa_m[T, r]
    if (M.dB)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M.out, r, T, M.scale, static_cast<const float*>(M.dy),
                  M.out, M.xa, r, 1.0f, M.dB, r);
  }
  if (!any_dA && !dx) return;
  std::vector<float> own;
  scratch = group_scratch(scratch, own, T, in, r, n);
  const int nr = n * r;
  float* dxa = scratch;                                            // [T, n r]
  float* S = scratch + static_cast<std::size_t>(T) * static_cast<std::size_t>(nr);  // [n r, in]
  // dxa[:, m r .. m r + r - 1] = scale_m * dy_m[T, out] @ B_m[out, r]
  for (int m = 0; m < n; ++m)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, r, g[m].out, g[m].scale,
                static_cast<const float*>(g[m].dy), g[m].out, g[m].B, r, 0.0f, dxa + m * r, nr);
  if (any_dA) {
    // S[n r, in] = dxa[T, n r]^T @ x[T, in]; dA_m += its rows m r .. m r + r - 1
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nr, in, T, 1.0f, dxa, nr, x, in, 0.0f, S, in);
    const std::size_t block = static_cast<std::size_t>(r) * static_cast<std::size_t>(in);
    for (int m = 0; m < n; ++m)
      if (g[m].dA)
        for (std::size_t i = 0; i < block; ++i) g[m].dA[i] += S[m * block + i];
  }
  if (dx) {
    // dx[T, in] += dxa[T, n r] @ [A_1; ..; A_n][n r, in]
    stack_A(S, g, n, in, r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, nr, 1.0f, dxa, nr, S, in, 1.0f, dx, in);
  }
}

void lora_merge(float* Wm, const float* W, const float* A, const float* B, float scale, int out, int in, int r) {
  if (out <= 0 || in <= 0) return;
  const std::size_t n_in = static_cast<std::size_t>(in);
  std::vector<float> acc(n_in);
  for (int o = 0; o < out; ++o) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* b = B + static_cast<std::size_t>(o) * static_cast<std::size_t>(r);
    // Over i for each k in turn: element (o, i) still sums k = 0, 1, .., r-1 in order.
    for (int k = 0; k < r; ++k) {
      const float bk = b[k];
      const float* a = A + static_cast<std::size_t>(k) * n_in;
      // Each product rounded on its own, then added: this file is compiled with -ffp-contract=off (no FMA).
      for (std::size_t i = 0; i < n_in; ++i) acc[i] += bk * a[i];
    }
    const float* w = W + static_cast<std::size_t>(o) * n_in;
    float* wm = Wm + static_cast<std::size_t>(o) * n_in;
    for (std::size_t i = 0; i < n_in; ++i) wm[i] = w[i] + scale * acc[i];
  }
}

}  // namespace mgrl::kernels::cpu
