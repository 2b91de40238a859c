// gemm.cpp: OpenBLAS GEMM, or the batch-invariant fixed-order kernel.
//
// The fixed order (every element, whatever the shapes): 8 lanes over k (lane j sums a[k+j] * b[k+j] for k = 0, 8,
// 16, ... while k + 8 <= K, each product rounded then added: no fused multiply-add), the lanes combined pairwise
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), then the tail k = K8 .. K-1 added one by one, then alpha and
// beta. The kernels below compute exactly that, element by element; they differ only in how many elements share a
// pass over a and b (register blocking), in holding a panel of B in L1 across the rows, and in the vector width
// (AVX2 where the CPU has it: 8 lanes in one register; SSE2 otherwise: two; one element at a time on CPUs other than
// x86-64). Same bits on every path (unit.ops_cpu holds each against its own one-element definition, bit for bit).
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define MGRL_GEMM_X86 1
#endif

#include <cstdint>

namespace mgrl::kernels::cpu {
namespace {
thread_local bool g_invariant = false;

inline float combine_lanes(const float* l) {
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// The tail of the dot product, alpha and beta, for one element whose lanes are summed into s.
inline void finish(float* c, float s, const float* a, const float* b, int K8, int K, float alpha, float beta) {
  for (int k = K8; k < K; ++k) s += a[k] * b[k];
  const float v = alpha * s;
  *c = beta == 0.0f ? v : v + beta * *c;
}

// The definition, one element at a time (the path on CPUs other than x86-64; FixedIsa::Scalar runs it anywhere).
void fixed_scalar(float* C, const float* A, const float* B, int M, int N, int K, float alpha,
                                   float beta) {
  const int K8 = K & ~7;
  for (int m = 0; m < M; ++m) {
    const float* a = A + static_cast<int64_t>(m) * K;
    float* c = C + static_cast<int64_t>(m) * N;
    for (int n = 0; n < N; ++n) {
      const float* b = B + static_cast<int64_t>(n) * K;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < K8; k += 8)
        for (int j = 0; j < 8; ++j) l[j] += a[k + j] * b[k + j];
      finish(c + n, combine_lanes(l), a, b, K8, K, alpha, beta);
    }
  }
}

#if MGRL_GEMM_X86
// Columns of B per panel: a panel (panel x K floats, ~24 KiB) stays in L1 while every row of A passes over it.
inline int panel_columns(int K) {
  const int p = 6144 / (K > 0 ? K : 1);
  return p < 4 ? 4 : (p & ~3);
}

// The four sums ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) of s0..s3 in one vector: the high half added to
// the low one gives (l0 + l4, l1 + l5, l2 + l6, l3 + l7), and two rounds of pairwise horizontal adds the rest, in
// that order.
__attribute__((target("avx2"))) inline __m128 combine4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  const __m128 t1 = _mm_add_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1));
  const __m128 t2 = _mm_add_ps(_mm256_castps256_ps128(s2), _mm256_extractf128_ps(s2, 1));
  const __m128 t3 = _mm_add_ps(_mm256_castps256_ps128(s3), _mm256_extractf128_ps(s3, 1));
  return _mm_hadd_ps(_mm_hadd_ps(t0, t1), _mm_hadd_ps(t2, t3));
}

// alpha and beta for four elements whose sums are complete (no tail).
__attribute__((target("avx2"))) inline void store4(float* c, __m128 s, float alpha, float beta) {
  const __m128 v = _mm_mul_ps(_mm_set1_ps(alpha), s);
  if (beta == 0.0f)
    _mm_storeu_ps(c, v);
  else
    _mm_storeu_ps(c, _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(beta), _mm_loadu_ps(c))));
}

// Two rows by four columns share each load (8 accumulators of 8 lanes); the lanes are combined in registers unless
// K has a tail (K % 8 != 0: then element by element, the tail added before alpha).
__attribute__((target("avx2"))) void fixed_avx2(float* C, const float* A, const float* B, int M, int N, int K,
                                                 float alpha, float beta) {
  const int K8 = K & ~7, panel = panel_columns(K);
  const bool tail = K8 != K;
  alignas(32) float l[8];
  for (int n0 = 0; n0 < N; n0 += panel) {
    const int n1 = n0 + panel < N ? n0 + panel : N;
    for (int m = 0; m < M; m += 2) {
      const bool two = m + 1 < M;  // an odd last row runs alone (its partner's sums are computed, not stored)
      const float* a0 = A + static_cast<int64_t>(m) * K;
      const float* a1 = two ? a0 + K : a0;
      float* c0 = C + static_cast<int64_t>(m) * N;
      float* c1 = c0 + N;
      int n = n0;
      for (; n + 4 <= n1; n += 4) {
        const float* b0 = B + static_cast<int64_t>(n) * K;
        const float *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, u0 = s0, u1 = s0, u2 = s0, u3 = s0;
        for (int k = 0; k < K8; k += 8) {
          const __m256 x = _mm256_loadu_ps(a0 + k), y = _mm256_loadu_ps(a1 + k);
          __m256 b = _mm256_loadu_ps(b0 + k);
          s0 = _mm256_add_ps(s0, _mm256_mul_ps(x, b));
          u0 = _mm256_add_ps(u0, _mm256_mul_ps(y, b));
          b = _mm256_loadu_ps(b1 + k);
          s1 = _mm256_add_ps(s1, _mm256_mul_ps(x, b));
          u1 = _mm256_add_ps(u1, _mm256_mul_ps(y, b));
          b = _mm256_loadu_ps(b2 + k);
          s2 = _mm256_add_ps(s2, _mm256_mul_ps(x, b));
          u2 = _mm256_add_ps(u2, _mm256_mul_ps(y, b));
          b = _mm256_loadu_ps(b3 + k);
          s3 = _mm256_add_ps(s3, _mm256_mul_ps(x, b));
          u3 = _mm256_add_ps(u3, _mm256_mul_ps(y, b));
        }
        if (!tail) {
          store4(c0 + n, combine4(s0, s1, s2, s3), alpha, beta);
          if (two) store4(c1 + n, combine4(u0, u1, u2, u3), alpha, beta);
          continue;
        }
        const __m256 s[4] = {s0, s1, s2, s3}, u[4] = {u0, u1, u2, u3};
        const float* b[4] = {b0, b1, b2, b3};
        for (int j = 0; j < 4; ++j) {
          _mm256_store_ps(l, s[j]);
          finish(c0 + n + j, combine_lanes(l), a0, b[j], K8, K, alpha, beta);
          if (!two) continue;
          _mm256_store_ps(l, u[j]);
          finish(c1 + n + j, combine_lanes(l), a1, b[j], K8, K, alpha, beta);
        }
      }
      for (; n < n1; ++n) {  // the last columns one at a time
        const float* b0 = B + static_cast<int64_t>(n) * K;
        __m256 s0 = _mm256_setzero_ps(), u0 = s0;
        for (int k = 0; k < K8; k += 8) {
          const __m256 b = _mm256_loadu_ps(b0 + k);
          s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(a0 + k), b));
          u0 = _mm256_add_ps(u0, _mm256_mul_ps(_mm256_loadu_ps(a1 + k), b));
        }
        _mm256_store_ps(l, s0);
        finish(c0 + n, combine_lanes(l), a0, b0, K8, K, alpha, beta);
        if (!two) continue;
        _mm256_store_ps(l, u0);
        finish(c1 + n, combine_lanes(l), a1, b0, K8, K, alpha, beta);
      }
    }
  }
}

// SSE2 (every x86-64): lanes 0-3 in one register, 4-7 in another; two columns share each load of a.
void fixed_sse2(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta) {
  const int K8 = K & ~7, panel = panel_columns(K);
  alignas(16) float l[2][8];
  for (int n0 = 0; n0 < N; n0 += panel) {
    const int n1 = n0 + panel < N ? n0 + panel : N;
    for (int m = 0; m < M; ++m) {
      const float* a = A + static_cast<int64_t>(m) * K;
      float* c = C + static_cast<int64_t>(m) * N;
      int n = n0;
      for (; n + 2 <= n1; n += 2) {
        const float* b0 = B + static_cast<int64_t>(n) * K;
        const float* b1 = b0 + K;
        __m128 s0 = _mm_setzero_ps(), t0 = s0, s1 = s0, t1 = s0;
        for (int k = 0; k < K8; k += 8) {
          const __m128 lo = _mm_loadu_ps(a + k), hi = _mm_loadu_ps(a + k + 4);
          s0 = _mm_add_ps(s0, _mm_mul_ps(lo, _mm_loadu_ps(b0 + k)));
          t0 = _mm_add_ps(t0, _mm_mul_ps(hi, _mm_loadu_ps(b0 + k + 4)));
          s1 = _mm_add_ps(s1, _mm_mul_ps(lo, _mm_loadu_ps(b1 + k)));
          t1 = _mm_add_ps(t1, _mm_mul_ps(hi, _mm_loadu_ps(b1 + k + 4)));
        }
        _mm_store_ps(l[0], s0);
        _mm_store_ps(l[0] + 4, t0);
        _mm_store_ps(l[1], s1);
        _mm_store_ps(l[1] + 4, t1);
        finish(c + n, combine_lanes(l[0]), a, b0, K8, K, alpha, beta);
        finish(c + n + 1, combine_lanes(l[1]), a, b1, K8, K, alpha, beta);
      }
      for (; n < n1; ++n) {
        const float* b0 = B + static_cast<int64_t>(n) * K;
        __m128 s0 = _mm_setzero_ps(), t0 = s0;
        for (int k = 0; k < K8; k += 8) {
          s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(a + k), _mm_loadu_ps(b0 + k)));
          t0 = _mm_add_ps(t0, _mm_mul_ps(_mm_loadu_ps(a + k + 4), _mm_loadu_ps(b0 + k + 4)));
        }
        _mm_store_ps(l[0], s0);
        _mm_store_ps(l[0] + 4, t0);
        finish(c + n, combine_lanes(l[0]), a, b0, K8, K, alpha, beta);
      }
    }
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#else
bool cpu_has_avx2() { return false; }
#endif
}  // namespace

void set_batch_invariant(bool on) { g_invariant = on; }
bool batch_invariant() { return g_invariant; }

void gemm_nt_fixed(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta,
                   FixedIsa isa) {
  if (M <= 0 || N <= 0) return;
  if (isa == FixedIsa::Scalar) return fixed_scalar(C, A, B, M, N, K, alpha, beta);
#if MGRL_GEMM_X86
  const bool avx2 = (isa == FixedIsa::Avx2 || isa == FixedIsa::Best) && cpu_has_avx2();
  if (avx2)
    fixed_avx2(C, A, B, M, N, K, alpha, beta);
  else
    fixed_sse2(C, A, B, M, N, K, alpha, beta);
#else
  fixed_scalar(C, A, B, M, N, K, alpha, beta);
#endif
}

bool gemm_nt_fixed_has_avx2() { return cpu_has_avx2(); }

void gemm_nt(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta) {
  if (M <= 0 || N <= 0) return;
  if (!g_invariant) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, K, B, K, beta, C, N);
    return;
  }
  gemm_nt_fixed(C, A, B, M, N, K, alpha, beta, FixedIsa::Best);
}

}  // namespace mgrl::kernels::cpu
