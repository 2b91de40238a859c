// lora.cu: LoRA adapter, y += scale * (x @ A^T) @ B^T, and its backward (dA, dB, added dx), for one adapter or a group
// of adapters that read the same x (lora_group_*: the products over x stacked, below). Two paths:
//
// cuBLAS (the default): the five products are tensor-core GEMMs with fp32 accumulation. The f32 operands (A, B, xa,
// dxa) enter as a split pair hi + lo of storage values (hi = round(v), lo = round(v - hi): about 16 significant bits),
// concatenated along the GEMM's N (the f32 results xa, dxa, dA, dB: the two halves of a [.., 2r] product summed by a
// small fold kernel) or K (the storage results y, dx: K = 2r). So xa, dxa, dA and dB keep about fp32 accuracy
// (relative ~1e-5) while every product runs on tensor cores, and no fp32 atomics are used.
//
// fused (MGRL_CUDA_LORA=fused): three custom kernel shapes cover the five products (r = rank, small):
//   rowdot  out[t, j]  = alpha * sum_i X[t, i] * M[j, i]         xa = x A^T;  dxa = scale * dy B (B transposed first)
//   addmm   Y[t, c]   += alpha * sum_j Z[t, j] * M(c, j)         y += scale * xa B^T;  dx += dxa A
//   outer   D(c, j)   += alpha * sum_t Y[t, c] * Z[t, j]         dB += scale * dy^T xa;  dA += dxa^T x
// X, Y are storage-dtype activations, Z, M, D f32. All sums in fp32.
//
// lora_merge (sampling with merged weights): Wm = W + scale * B A, one tile of kMergeRows x kMergeCols outputs per
// block, A and B streamed through shared memory in chunks of kMergeK ranks.
#include "kernels/cuda/lora.cuh"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
#include "kernels/cuda/gemm.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kRowdotRows = 4;   // rowdot: token rows per block (amortises the reads of M over 4 rows)
constexpr int kAddmmRows = 8;    // addmm: token rows per block
constexpr int kOuterRows = 32;   // outer: token rows per block (one atomicAdd per (c, j) per block)

// rowdot: grid.x = ceil(T / kRowdotRows), block kThreads (8 warps). Warp w computes the outputs j = w, w + 8, ...
// of the block's rows: lanes stride over i (coalesced reads of X and of M's row j), partial sums in registers,
// then one warp reduction per row. M is row-major [r, K].
template <class S>
__global__ void lora_rowdot_kernel(float* out, const S* X, const float* M, int T, int K, int r, float alpha) {
  const int t0 = blockIdx.x * kRowdotRows;
  const int nrows = min(kRowdotRows, T - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = warp; j < r; j += nw) {  // uniform within a warp: the shuffles below see all 32 lanes
    const float* m = M + static_cast<std::int64_t>(j) * K;
    float acc[kRowdotRows];
#pragma unroll
    for (int tt = 0; tt < kRowdotRows; ++tt) acc[tt] = 0.0f;
    for (int i = lane; i < K; i += 32) {
      const float mv = m[i];
#pragma unroll
      for (int tt = 0; tt < kRowdotRows; ++tt)
        if (tt < nrows) acc[tt] += to_f32(X[static_cast<std::int64_t>(t0 + tt) * K + i]) * mv;
    }
#pragma unroll
    for (int tt = 0; tt < kRowdotRows; ++tt) {
      const float s = warp_sum(acc[tt]);
      if (lane == 0 && tt < nrows) out[static_cast<std::int64_t>(t0 + tt) * r + j] = alpha * s;
    }
  }
}

// addmm: grid (ceil(T / kAddmmRows), ceil(N / kThreads)), block kThreads, dynamic shared kAddmmRows * r floats.
// The block's rows of Z go to shared memory; thread c reads M(c, j) = M[c * mc + j * mj] once per j and updates its
// kAddmmRows accumulators; Y[t, c] is read, added to in fp32 and rounded once.
template <class S>
__global__ void lora_addmm_kernel(S* Y, const float* Z, const float* M, int T, int N, int r, std::int64_t mc,
                                  std::int64_t mj, float alpha) {
  extern __shared__ float zs[];  // [kAddmmRows, r]
  const int t0 = blockIdx.x * kAddmmRows;
  const int nrows = min(kAddmmRows, T - t0);
  for (int k = threadIdx.x; k < kAddmmRows * r; k += blockDim.x)
    zs[k] = k < nrows * r ? Z[static_cast<std::int64_t>(t0) * r + k] : 0.0f;  // rows t0.. are contiguous
  __syncthreads();
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float acc[kAddmmRows];
#pragma unroll
  for (int tt = 0; tt < kAddmmRows; ++tt) acc[tt] = 0.0f;
  for (int j = 0; j < r; ++j) {
    const float mv = M[c * mc + j * mj];
#pragma unroll
    for (int tt = 0; tt < kAddmmRows; ++tt) acc[tt] += zs[tt * r + j] * mv;
  }
#pragma unroll
  for (int tt = 0; tt < kAddmmRows; ++tt) {
    if (tt < nrows) {
      S* y = Y + static_cast<std::int64_t>(t0 + tt) * N + c;
      *y = from_f32<S>(to_f32(*y) + alpha * acc[tt]);
    }
  }
}

// outer: grid (ceil(T / kOuterRows), ceil(N / kThreads)), block kThreads, dynamic shared kOuterRows * r floats.
// Thread c loads its column of the block's Y rows into registers, then for each j sums over those rows against Z
// (shared, broadcast) and does one fp32 atomicAdd into D(c, j) = D[c * dc + j * dj]. The order of the atomic
// additions over blocks is not deterministic (last-bit differences between runs).
template <class S>
__global__ void lora_outer_kernel(float* D, const S* Y, const float* Z, int T, int N, int r, std::int64_t dc,
                                  std::int64_t dj, float alpha) {
  extern __shared__ float zs[];  // [kOuterRows, r]
  const int t0 = blockIdx.x * kOuterRows;
  const int nrows = min(kOuterRows, T - t0);
  for (int k = threadIdx.x; k < kOuterRows * r; k += blockDim.x)
    zs[k] = k < nrows * r ? Z[static_cast<std::int64_t>(t0) * r + k] : 0.0f;
  __syncthreads();
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float yv[kOuterRows];
#pragma unroll
  for (int tt = 0; tt < kOuterRows; ++tt)
    yv[tt] = tt < nrows ? to_f32(Y[static_cast<std::int64_t>(t0 + tt) * N + c]) : 0.0f;
  for (int j = 0; j < r; ++j) {
    float acc = 0.0f;
#pragma unroll
    for (int tt = 0; tt < kOuterRows; ++tt) acc += yv[tt] * zs[tt * r + j];
    atomicAdd(D + c * dc + j * dj, alpha * acc);
  }
}

// Bt[j, o] = B[o, j]: B [out, r] -> Bt [r, out], so that rowdot reads B's columns contiguously.
__global__ void transpose_kernel(float* Bt, const float* B, int out, int r) {
  const std::int64_t n = static_cast<std::int64_t>(out) * r;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t o = i / r, j = i % r;
    Bt[j * out + o] = B[i];
  }
}

unsigned blocks(int n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

void check_sizes(int T, int in, int r, int out) {
  MGRL_CHECK(r <= kMaxLoraRank, "the CUDA LoRA kernels take ranks up to " + std::to_string(kMaxLoraRank) + " (got " +
                                    std::to_string(r) + ")");
  MGRL_CHECK(in >= 0 && out >= 0 && T >= 0, "negative LoRA sizes");
  MGRL_CHECK(blocks(in, kThreads) <= 65535u && blocks(out, kThreads) <= 65535u, "LoRA layer too wide for grid.y");
}

template <class S>
void rowdot(const Ctx& c, float* o, const void* X, const float* M, int T, int K, int r, float alpha) {
  lora_rowdot_kernel<S><<<blocks(T, kRowdotRows), kThreads, 0, c.stream>>>(o, static_cast<const S*>(X), M, T, K, r,
                                                                           alpha);
  CUDA_CHECK_LAUNCH();
}

template <class S>
void addmm(const Ctx& c, void* Y, const float* Z, const float* M, int T, int N, int r, std::int64_t mc,
           std::int64_t mj, float alpha) {
  if (N <= 0) return;
  const dim3 grid(blocks(T, kAddmmRows), blocks(N, kThreads));
  const std::size_t smem = sizeof(float) * kAddmmRows * static_cast<std::size_t>(r);
  lora_addmm_kernel<S><<<grid, kThreads, smem, c.stream>>>(static_cast<S*>(Y), Z, M, T, N, r, mc, mj, alpha);
  CUDA_CHECK_LAUNCH();
}

template <class S>
void outer(const Ctx& c, float* D, const void* Y, const float* Z, int T, int N, int r, std::int64_t dc,
           std::int64_t dj, float alpha) {
  if (N <= 0) return;
  const dim3 grid(blocks(T, kOuterRows), blocks(N, kThreads));
  const std::size_t smem = sizeof(float) * kOuterRows * static_cast<std::size_t>(r);
  lora_outer_kernel<S><<<grid, kThreads, smem, c.stream>>>(D, static_cast<const S*>(Y), Z, T, N, r, dc, dj, alpha);
  CUDA_CHECK_LAUNCH();
}


// ---- the cuBLAS path ----

// Split f32 values into storage pairs: for row i < rows, column c < cols of src (row length cols),
// dst[i * ld + c] = hi = round(alpha * v) and, when lo_off >= 0, dst[i * ld + c + lo_off] = round(alpha * v - hi);
// when lo_off < 0 the second copy is hi again at offset -lo_off (a duplicate, for the K-concatenated products).
template <class S>
__device__ __forceinline__ void split_one(S* dst, const float* src, std::int64_t k, int cols, std::int64_t ld,
                                          std::int64_t lo_off, float alpha) {
  const std::int64_t i = k / cols, c = k % cols;
  const float v = alpha * src[k];
  const S hi = from_f32<S>(v);
  dst[i * ld + c] = hi;
  if (lo_off >= 0)
    dst[i * ld + c + lo_off] = from_f32<S>(v - to_f32(hi));
  else
    dst[i * ld + c - lo_off] = hi;
}

// Up to kMaxSplitJobs independent splits in one launch (the operands of one call): part p covers n[p] elements.
struct SplitJob {
  void* dst;
  const float* src;
  std::int64_t n;
  int cols;
  std::int64_t ld, lo_off;
  float alpha;
};
constexpr int kMaxSplitJobs = 3 * kMaxLoraGroup;  // a group's backward: xa, B and A of each member
struct SplitJobs {
  SplitJob j[kMaxSplitJobs];
  int count;
};

template <class S>
__global__ void lora_split_kernel(SplitJobs jobs, std::int64_t total) {
  for (std::int64_t k = gs_begin(); k < total; k += gs_stride()) {
    std::int64_t kk = k;
    int p = 0;
    while (p + 1 < jobs.count && kk >= jobs.j[p].n) kk -= jobs.j[p++].n;
    const SplitJob& J = jobs.j[p];
    split_one<S>(static_cast<S*>(J.dst), J.src, kk, J.cols, J.ld, J.lo_off, J.alpha);
  }
}

// Fold the two halves of a split product: v = src[i * lds + c] + src[i * lds + c + lo_off]; out[i * cols + c] (= or +=)
// v when out is non-null, and, when pair is non-null, v's own storage split pair[i * pair_ld + c] = hi,
// [.. + pair_lo] = lo (the next product's operand; pair_ld = 0: the [rows, 2 cols] layout hi | lo). Up to
// kMaxFoldJobs folds in one launch.
struct FoldJob {
  float* out;
  const float* src;
  void* pair;
  std::int64_t n;
  int cols;
  std::int64_t lds, lo_off;
  bool accumulate;
  std::int64_t pair_ld = 0, pair_lo = 0;
};
constexpr int kMaxFoldJobs = 2 * kMaxLoraGroup;  // a group's backward: dB and dA of each member
struct FoldJobs {
  FoldJob j[kMaxFoldJobs];
  int count;
};

template <class S>
__global__ void lora_fold_kernel(FoldJobs jobs, std::int64_t total) {
  for (std::int64_t k = gs_begin(); k < total; k += gs_stride()) {
    std::int64_t kk = k;
    int p = 0;
    while (p + 1 < jobs.count && kk >= jobs.j[p].n) kk -= jobs.j[p++].n;
    const FoldJob& J = jobs.j[p];
    const std::int64_t i = kk / J.cols, c = kk % J.cols;
    float v = J.src[i * J.lds + c] + J.src[i * J.lds + c + J.lo_off];
    if (J.out) {
      if (J.accumulate) v += J.out[kk];
      J.out[kk] = v;
    }
    if (J.pair) {
      const std::int64_t ld = J.pair_ld > 0 ? J.pair_ld : 2 * static_cast<std::int64_t>(J.cols);
      S* q = static_cast<S*>(J.pair) + i * ld + c;
      const S hi = from_f32<S>(v);
      q[0] = hi;
      q[J.pair_ld > 0 ? J.pair_lo : J.cols] = from_f32<S>(v - to_f32(hi));
    }
  }
}

template <class S>
void split(const Ctx& c, const SplitJobs& jobs) {
  std::int64_t total = 0;
  for (int p = 0; p < jobs.count; ++p) total += jobs.j[p].n;
  if (total <= 0) return;
  lora_split_kernel<S><<<grid_for(total), kThreads, 0, c.stream>>>(jobs, total);
  CUDA_CHECK_LAUNCH();
}

template <class S>
void fold(const Ctx& c, const FoldJobs& jobs) {
  std::int64_t total = 0;
  for (int p = 0; p < jobs.count; ++p) total += jobs.j[p].n;
  if (total <= 0) return;
  lora_fold_kernel<S><<<grid_for(total), kThreads, 0, c.stream>>>(jobs, total);
  CUDA_CHECK_LAUNCH();
}

// One stream-ordered scratch allocation carved into aligned pieces.
struct Carve {
  char* base;
  std::size_t used = 0;
  template <class T>
  T* take(std::size_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

template <class S>
void gemm_forward(const Ctx& c, void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                  int in, int r, int out) {
  const DType st = c.st;
  const std::size_t r2 = 2 * static_cast<std::size_t>(r);
  const std::size_t bytes = (r2 * in * sizeof(S) + 255) / 256 * 256 + (out * r2 * sizeof(S) + 255) / 256 * 256 +
                            (T * r2 * sizeof(float) + 255) / 256 * 256 + (T * r2 * sizeof(S) + 255) / 256 * 256;
  Carve cv{static_cast<char*>(scratch_alloc(bytes, c.stream))};
  S* A2 = cv.take<S>(r2 * in);     // [2r, in]: rows 0..r-1 hi(A), rows r..2r-1 lo(A)
  S* B2 = cv.take<S>(out * r2);    // [out, 2r]: round(scale B) twice (K-concatenated with xa's hi | lo)
  float* P = cv.take<float>(T * r2);  // [T, 2r]: x hi(A)^T | x lo(A)^T
  S* xa2 = cv.take<S>(T * r2);     // [T, 2r]: hi(xa) | lo(xa)
  SplitJobs sj{};
  sj.j[0] = {A2, A, static_cast<std::int64_t>(r) * in, in, in, static_cast<std::int64_t>(r) * in, 1.0f};
  sj.j[1] = {B2, B, static_cast<std::int64_t>(out) * r, r, static_cast<std::int64_t>(r2), -r, scale};
  sj.count = 2;
  split<S>(c, sj);
  // P[T, 2r] = x[T, in] @ A2[2r, in]^T
  gemm_rm(c.blas, false, true, T, static_cast<int>(r2), in, 1.0f, x, st, in, A2, st, in, 0.0f, P, DType::F32,
          static_cast<int>(r2));
  FoldJobs fj{};
  fj.j[0] = {xa, P, xa2, static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(r2), r, false};
  fj.count = 1;
  fold<S>(c, fj);
  // y[T, out] += xa2[T, 2r] @ B2[out, 2r]^T = (hi(xa) + lo(xa)) @ round(scale B)^T
  gemm_rm(c.blas, false, true, T, out, static_cast<int>(r2), 1.0f, xa2, st, static_cast<int>(r2), B2, st,
          static_cast<int>(r2), 1.0f, y, st, out);
  scratch_free(cv.base, c.stream);
}

template <class S>
void gemm_backward(const Ctx& c, void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa,
                   const float* A, const float* B, float scale, int T, int in, int r, int out, float* scratch) {
  const DType st = c.st;
  const std::size_t r2 = 2 * static_cast<std::size_t>(r);
  const bool need_dxa = dA || dx;
  auto al = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t bytes = al(r2 * in * sizeof(S)) + al(out * r2 * sizeof(S)) + al(T * r2 * sizeof(S)) * 2 +
                            al(T * r2 * sizeof(float)) + al(out * r2 * sizeof(float)) + al(r2 * in * sizeof(float)) +
                            (scratch ? 0 : al(static_cast<std::size_t>(T) * r * sizeof(float)));
  Carve cv{static_cast<char*>(scratch_alloc(bytes, c.stream))};
  S* Ad = cv.take<S>(r2 * in);       // [2r, in]: round(A) twice (K-concatenated with dxa's hi | lo)
  S* B2 = cv.take<S>(out * r2);      // [out, 2r]: hi(B) | lo(B)
  S* xa2 = cv.take<S>(T * r2);       // [T, 2r]: hi(xa) | lo(xa)
  S* dxa2 = cv.take<S>(T * r2);      // [T, 2r]: hi(dxa) | lo(dxa)
  float* P = cv.take<float>(T * r2);     // [T, 2r]: scale dy hi(B) | scale dy lo(B)
  float* Q = cv.take<float>(out * r2);   // [out, 2r]: scale dy^T hi(xa) | scale dy^T lo(xa)
  float* R = cv.take<float>(r2 * in);    // [2r, in]: hi(dxa)^T x ; lo(dxa)^T x
  float* dxa = scratch ? scratch : cv.take<float>(static_cast<std::size_t>(T) * r);
  SplitJobs sj{};
  int n = 0;
  if (dB) sj.j[n++] = {xa2, xa, static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(r2), r, 1.0f};
  if (need_dxa) sj.j[n++] = {B2, B, static_cast<std::int64_t>(out) * r, r, static_cast<std::int64_t>(r2), r, 1.0f};
  if (dx) sj.j[n++] = {Ad, A, static_cast<std::int64_t>(r) * in, in, in, -static_cast<std::int64_t>(r) * in, 1.0f};
  sj.count = n;
  split<S>(c, sj);
  // Q[out, 2r] = scale dy[T, out]^T @ xa2[T, 2r]
  if (dB)
    gemm_rm(c.blas, true, false, out, static_cast<int>(r2), T, scale, dy, st, out, xa2, st, static_cast<int>(r2), 0.0f,
            Q, DType::F32, static_cast<int>(r2));
  if (need_dxa) {
    // P[T, 2r] = scale dy[T, out] @ B2[out, 2r]; dxa = its two halves summed (and split for the next products)
    gemm_rm(c.blas, false, false, T, static_cast<int>(r2), out, scale, dy, st, out, B2, st, static_cast<int>(r2),
            0.0f, P, DType::F32, static_cast<int>(r2));
    FoldJobs fj{};
    fj.j[0] = {dxa, P, dxa2, static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(r2), r, false};
    fj.count = 1;
    fold<S>(c, fj);
  }
  // R[2r, in] = dxa2[T, 2r]^T @ x[T, in]
  if (dA)
    gemm_rm(c.blas, true, false, static_cast<int>(r2), in, T, 1.0f, dxa2, st, static_cast<int>(r2), x, st, in, 0.0f,
            R, DType::F32, in);
  FoldJobs fj{};
  n = 0;
  if (dB) fj.j[n++] = {dB, Q, nullptr, static_cast<std::int64_t>(out) * r, r, static_cast<std::int64_t>(r2), r, true};
  if (dA)
    fj.j[n++] = {dA, R, nullptr, static_cast<std::int64_t>(r) * in, in, in, static_cast<std::int64_t>(r) * in, true};
  fj.count = n;
  fold<S>(c, fj);
  // dx[T, in] += dxa2[T, 2r] @ Ad[2r, in] = (hi(dxa) + lo(dxa)) @ round(A)
  if (dx)
    gemm_rm(c.blas, false, false, T, in, static_cast<int>(r2), 1.0f, dxa2, st, static_cast<int>(r2), Ad, st, in, 1.0f,
            dx, st, in);
  scratch_free(cv.base, c.stream);
}

// A group (kernels/lora_group.h) on the cuBLAS path. The members' A enter stacked in one scratch operand (the split
// copies A anyway), so the products that touch x run once for the group:
//   forward   P[T, 2nr] = x @ A2^T, A2 rows: hi(A_1..A_n) | lo(A_1..A_n); each member's xa = its two halves summed
//             (and split to xa2_m), then y_m += xa2_m @ B2_m^T per member
//   backward  per member Q_m = scale dy_m^T xa2_m (dB) and P's columns 2 m r .. = scale dy_m @ (hi(B_m) | lo(B_m));
//             dxa2[T, 2nr] = hi(dxa_1..dxa_n) | lo(dxa_1..dxa_n) folded from P (no f32 dxa is kept);
//             R[2nr, in] = dxa2^T @ x (dA_m: rows m r .. plus nr + m r ..), dx += dxa2 @ Ad (Ad rows: round(A_1..A_n)
//             twice)
template <class S>
void gemm_group_forward(const Ctx& c, const LoraMember* g, int n, const void* x, int T, int in, int r) {
  const DType st = c.st;
  const std::size_t r2 = 2 * static_cast<std::size_t>(r), nr = static_cast<std::size_t>(n) * r, nr2 = 2 * nr;
  auto al = [](std::size_t b) { return (b + 255) / 256 * 256; };
  std::size_t bytes = al(nr2 * in * sizeof(S)) + al(T * nr2 * sizeof(float));
  for (int m = 0; m < n; ++m) bytes += al(g[m].out * r2 * sizeof(S)) + al(T * r2 * sizeof(S));
  Carve cv{static_cast<char*>(scratch_alloc(bytes, c.stream))};
  S* A2 = cv.take<S>(nr2 * in);         // [2nr, in]: hi(A_1; ..; A_n) then lo(A_1; ..; A_n)
  float* P = cv.take<float>(T * nr2);   // [T, 2nr]: x hi(A)^T | x lo(A)^T
  S* B2[kMaxLoraGroup];
  S* xa2[kMaxLoraGroup];
  SplitJobs sj{};
  FoldJobs fj{};
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    B2[m] = cv.take<S>(M.out * r2);  // [out, 2r]: round(scale B) twice (K-concatenated with xa's hi | lo)
    xa2[m] = cv.take<S>(T * r2);     // [T, 2r]: hi(xa) | lo(xa)
    sj.j[sj.count++] = {A2 + m * static_cast<std::size_t>(r) * in, M.A, static_cast<std::int64_t>(r) * in, in, in,
                        static_cast<std::int64_t>(nr) * in, 1.0f};
    sj.j[sj.count++] = {B2[m], M.B, static_cast<std::int64_t>(M.out) * r, r, static_cast<std::int64_t>(r2), -r,
                        M.scale};
    fj.j[fj.count++] = {M.xa, P + m * r, xa2[m], static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(nr2),
                        static_cast<std::int64_t>(nr), false};
  }
  split<S>(c, sj);
  // P[T, 2nr] = x[T, in] @ A2[2nr, in]^T: the group's one product over x
  gemm_rm(c.blas, false, true, T, static_cast<int>(nr2), in, 1.0f, x, st, in, A2, st, in, 0.0f, P, DType::F32,
          static_cast<int>(nr2));
  fold<S>(c, fj);
  // y_m[T, out] += xa2_m[T, 2r] @ B2_m[out, 2r]^T
  for (int m = 0; m < n; ++m)
    gemm_rm(c.blas, false, true, T, g[m].out, static_cast<int>(r2), 1.0f, xa2[m], st, static_cast<int>(r2), B2[m], st,
            static_cast<int>(r2), 1.0f, g[m].y, st, g[m].out);
  scratch_free(cv.base, c.stream);
}

template <class S>
void gemm_group_backward(const Ctx& c, void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r) {
  const DType st = c.st;
  const std::size_t r2 = 2 * static_cast<std::size_t>(r), nr = static_cast<std::size_t>(n) * r, nr2 = 2 * nr;
  bool any_dA = false;
  for (int m = 0; m < n; ++m) any_dA = any_dA || g[m].dA;
  const bool need_dxa = any_dA || dx;
  auto al = [](std::size_t b) { return (b + 255) / 256 * 256; };
  std::size_t bytes = al(nr2 * in * sizeof(S)) + al(T * nr2 * sizeof(S)) + al(T * nr2 * sizeof(float)) +
                      al(nr2 * in * sizeof(float));
  for (int m = 0; m < n; ++m)
    bytes += al(g[m].out * r2 * sizeof(S)) + al(T * r2 * sizeof(S)) + al(g[m].out * r2 * sizeof(float));
  Carve cv{static_cast<char*>(scratch_alloc(bytes, c.stream))};
  S* Ad = cv.take<S>(nr2 * in);         // [2nr, in]: round(A_1; ..; A_n) twice (K-concatenated with dxa2)
  S* dxa2 = cv.take<S>(T * nr2);        // [T, 2nr]: hi(dxa_1 | .. | dxa_n) | lo(dxa_1 | .. | dxa_n)
  float* P = cv.take<float>(T * nr2);   // [T, 2nr]: member m's scale dy_m hi(B_m) | scale dy_m lo(B_m) at 2 m r
  float* R = cv.take<float>(nr2 * in);  // [2nr, in]: hi(dxa)^T x ; lo(dxa)^T x
  S* B2[kMaxLoraGroup];
  S* xa2[kMaxLoraGroup];
  float* Q[kMaxLoraGroup];
  SplitJobs sj{};
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    B2[m] = cv.take<S>(M.out * r2);     // [out, 2r]: hi(B) | lo(B)
    xa2[m] = cv.take<S>(T * r2);        // [T, 2r]: hi(xa) | lo(xa)
    Q[m] = cv.take<float>(M.out * r2);  // [out, 2r]: scale dy^T hi(xa) | scale dy^T lo(xa)
    if (M.dB)
      sj.j[sj.count++] = {xa2[m], M.xa, static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(r2), r, 1.0f};
    if (need_dxa)
      sj.j[sj.count++] = {B2[m], M.B, static_cast<std::int64_t>(M.out) * r, r, static_cast<std::int64_t>(r2), r, 1.0f};
    if (dx)
      sj.j[sj.count++] = {Ad + m * static_cast<std::size_t>(r) * in, M.A, static_cast<std::int64_t>(r) * in, in, in,
                          -static_cast<std::int64_t>(nr) * in, 1.0f};
  }
  split<S>(c, sj);
  FoldJobs fj{};
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    // Q_m[out, 2r] = scale dy_m[T, out]^T @ xa2_m[T, 2r]
    if (M.dB)
      gemm_rm(c.blas, true, false, M.out, static_cast<int>(r2), T, M.scale, M.dy, st, M.out, xa2[m], st,
              static_cast<int>(r2), 0.0f, Q[m], DType::F32, static_cast<int>(r2));
    if (!need_dxa) continue;
    // P[:, 2 m r .. 2 m r + 2r - 1] = scale dy_m[T, out] @ B2_m[out, 2r]
    gemm_rm(c.blas, false, false, T, static_cast<int>(r2), M.out, M.scale, M.dy, st, M.out, B2[m], st,
            static_cast<int>(r2), 0.0f, P + 2 * m * static_cast<std::size_t>(r), DType::F32, static_cast<int>(nr2));
    // dxa_m = its two halves summed, split into dxa2's columns m r (hi) and nr + m r (lo)
    fj.j[fj.count++] = {nullptr, P + 2 * m * static_cast<std::size_t>(r), dxa2 + m * static_cast<std::size_t>(r),
                        static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(nr2), r, false,
                        static_cast<std::int64_t>(nr2), static_cast<std::int64_t>(nr)};
  }
  fold<S>(c, fj);
  // R[2nr, in] = dxa2[T, 2nr]^T @ x[T, in]: the group's one product over x for dA
  if (any_dA)
    gemm_rm(c.blas, true, false, static_cast<int>(nr2), in, T, 1.0f, dxa2, st, static_cast<int>(nr2), x, st, in, 0.0f,
            R, DType::F32, in);
  FoldJobs fd{};
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    if (M.dB)
      fd.j[fd.count++] = {M.dB, Q[m], nullptr, static_cast<std::int64_t>(M.out) * r, r, static_cast<std::int64_t>(r2),
                          r, true};
    if (M.dA)
      fd.j[fd.count++] = {M.dA, R + m * static_cast<std::size_t>(r) * in, nullptr, static_cast<std::int64_t>(r) * in,
                          in, in, static_cast<std::int64_t>(nr) * in, true};
  }
  fold<S>(c, fd);
  // dx[T, in] += dxa2[T, 2nr] @ Ad[2nr, in]: the group's one product over dx
  if (dx)
    gemm_rm(c.blas, false, false, T, in, static_cast<int>(nr2), 1.0f, dxa2, st, static_cast<int>(nr2), Ad, st, in,
            1.0f, dx, st, in);
  scratch_free(cv.base, c.stream);
}

// MGRL_CUDA_LORA=fused selects the custom kernels (read once).
bool use_fused() {
  static const bool fused = [] {
    const char* e = std::getenv("MGRL_CUDA_LORA");
    return e != nullptr && std::strcmp(e, "fused") == 0;
  }();
  return fused;
}

}  // namespace

void lora_forward(const Ctx& c, void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                  int in, int r, int out) {
  if (T <= 0 || r <= 0) return;
  check_sizes(T, in, r, out);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (!use_fused()) return gemm_forward<S>(c, y, xa, x, A, B, scale, T, in, r, out);
    // xa[T, r] = x[T, in] @ A[r, in]^T             (A is row-major [r, in]: M = A)
    rowdot<S>(c, xa, x, A, T, in, r, 1.0f);
    // y[T, out] += scale * xa[T, r] @ B[out, r]^T  (M(c = o, j) = B[o * r + j])
    addmm<S>(c, y, xa, B, T, out, r, r, 1, scale);
  });
}

void lora_backward(const Ctx& c, void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa,
                   const float* A, const float* B, float scale, int T, int in, int r, int out, float* scratch) {
  if (T <= 0 || r <= 0) return;
  check_sizes(T, in, r, out);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (!use_fused()) return gemm_backward<S>(c, dx, dA, dB, dy, x, xa, A, B, scale, T, in, r, out, scratch);
    // dB[out, r] += scale * dy[T, out]^T @ xa[T, r]   (D(c = o, j) = dB[o * r + j])
    if (dB) outer<S>(c, dB, dy, xa, T, out, r, r, 1, scale);
    if (!dA && !dx) return;
    float* dxa = scratch ? scratch : static_cast<float*>(scratch_alloc(sizeof(float) * T * r, c.stream));
    // dxa[T, r] = scale * dy[T, out] @ B[out, r]: rowdot against Bt [r, out]
    float* Bt = static_cast<float*>(scratch_alloc(sizeof(float) * out * static_cast<std::size_t>(r), c.stream));
    if (out > 0) {
      transpose_kernel<<<grid_for(static_cast<std::int64_t>(out) * r), kThreads, 0, c.stream>>>(Bt, B, out, r);
      CUDA_CHECK_LAUNCH();
    }
    rowdot<S>(c, dxa, dy, Bt, T, out, r, scale);
    scratch_free(Bt, c.stream);
    // dA[r, in] += dxa[T, r]^T @ x[T, in]          (D(c = i, j) = dA[j * in + i])
    if (dA) outer<S>(c, dA, x, dxa, T, in, r, 1, in, 1.0f);
    // dx[T, in] += dxa[T, r] @ A[r, in]            (M(c = i, j) = A[j * in + i])
    if (dx) addmm<S>(c, dx, dxa, A, T, in, r, 1, in, 1.0f);
    if (!scratch) scratch_free(dxa, c.stream);
  });
}

// The linears of a group and their adapters as one GEMM a member over concatenated operands (MGRL_LORA_CONCAT=1):
//   H[T, K] = x | hi(xa_1) | lo(xa_1) | .. | hi(xa_n) | lo(xa_n)       (K = in + 2nr; xa_m = x A_m^T, f32, also
//             stored in xa_m for the backward)
//   Wc_m[out_m, K] = W_m | 0 .. | round(s_m B_m) | round(s_m B_m) | .. 0   (the adapter's columns at in + 2 m r)
//   y_m[T, out_m] = H Wc_m^T: x W_m^T + (hi(xa_m) + lo(xa_m)) round(s_m B_m)^T in one fp32 sum, rounded once.
// Against the base GEMM followed by the adapter's y += xa2 B2^T (gemm_group_forward), y is written once instead of
// written, read and written again: 2 T out_m elements less per member, for a copy of x (2 T in) and of W_m (2 out_m
// in) into the operands; worth it when in < sum of out_m (gate|up: 896 against 9728 at Qwen2.5-0.5B).
template <class S>
void gemm_concat_forward(const Ctx& c, const LoraMember* g, const void* const* W, int n, const void* x, int T, int in,
                         int r) {
  const DType st = c.st;
  const std::size_t nr = static_cast<std::size_t>(n) * r, nr2 = 2 * nr, K = in + nr2;
  std::size_t outs = 0;
  for (int m = 0; m < n; ++m) outs += static_cast<std::size_t>(g[m].out);
  auto al = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t bytes = al(T * K * sizeof(S)) + al(outs * K * sizeof(S)) + al(nr2 * in * sizeof(S)) +
                            al(T * nr2 * sizeof(float));
  Carve cv{static_cast<char*>(scratch_alloc(bytes, c.stream))};
  S* H = cv.take<S>(T * K);
  S* Wc = cv.take<S>(outs * K);
  S* A2 = cv.take<S>(nr2 * in);        // [2nr, in]: hi(A_1; ..; A_n) then lo(A_1; ..; A_n)
  float* P = cv.take<float>(T * nr2);  // [T, 2nr]: x hi(A)^T | x lo(A)^T
  const std::size_t es = sizeof(S);
  CUDA_CHECK(cudaMemcpy2DAsync(H, K * es, x, in * es, in * es, T, cudaMemcpyDeviceToDevice, c.stream));
  SplitJobs sj{};
  S* Wm[kMaxLoraGroup];
  std::size_t row = 0;
  for (int m = 0; m < n; ++m) {
    const LoraMember& M = g[m];
    Wm[m] = Wc + row * K;
    row += static_cast<std::size_t>(M.out);
    CUDA_CHECK(cudaMemcpy2DAsync(Wm[m], K * es, W[m], in * es, in * es, M.out, cudaMemcpyDeviceToDevice, c.stream));
    CUDA_CHECK(cudaMemset2DAsync(Wm[m] + in, K * es, 0, nr2 * es, M.out, c.stream));
    sj.j[sj.count++] = {A2 + m * static_cast<std::size_t>(r) * in, M.A, static_cast<std::int64_t>(r) * in, in, in,
                        static_cast<std::int64_t>(nr) * in, 1.0f};
    sj.j[sj.count++] = {Wm[m] + in + 2 * static_cast<std::size_t>(m) * r, M.B, static_cast<std::int64_t>(M.out) * r,
                        r, static_cast<std::int64_t>(K), -r, M.scale};
  }
  split<S>(c, sj);  // after the zeroing of Wc's adapter columns (same stream)
  // P[T, 2nr] = x[T, in] @ A2[2nr, in]^T
  gemm_rm(c.blas, false, true, T, static_cast<int>(nr2), in, 1.0f, x, st, in, A2, st, in, 0.0f, P, DType::F32,
          static_cast<int>(nr2));
  FoldJobs fj{};
  for (int m = 0; m < n; ++m)
    fj.j[fj.count++] = {g[m].xa, P + m * r, H + in + 2 * static_cast<std::size_t>(m) * r,
                        static_cast<std::int64_t>(T) * r, r, static_cast<std::int64_t>(nr2),
                        static_cast<std::int64_t>(nr), false, static_cast<std::int64_t>(K), r};
  fold<S>(c, fj);
  // y_m[T, out_m] = H[T, K] @ Wc_m[out_m, K]^T
  for (int m = 0; m < n; ++m)
    gemm_rm(c.blas, false, true, T, g[m].out, static_cast<int>(K), 1.0f, H, st, static_cast<int>(K), Wm[m], st,
            static_cast<int>(K), 0.0f, g[m].y, st, g[m].out);
  scratch_free(cv.base, c.stream);
}

void lora_group_forward(const Ctx& c, const LoraMember* g, int n, const void* x, int T, int in, int r) {
  if (T <= 0 || r <= 0 || n <= 0) return;
  MGRL_CHECK(n <= kMaxLoraGroup, "a LoRA group of more than " + std::to_string(kMaxLoraGroup) + " members");
  for (int m = 0; m < n; ++m) check_sizes(T, in, r, g[m].out);
  if (use_fused()) {  // the custom kernels: member by member
    for (int m = 0; m < n; ++m) lora_forward(c, g[m].y, g[m].xa, x, g[m].A, g[m].B, g[m].scale, T, in, r, g[m].out);
    return;
  }
  dispatch(c.st, [&](auto tag) { gemm_group_forward<decltype(tag)>(c, g, n, x, T, in, r); });
}

void lora_group_backward(const Ctx& c, void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r) {
  if (T <= 0 || r <= 0 || n <= 0) return;
  MGRL_CHECK(n <= kMaxLoraGroup, "a LoRA group of more than " + std::to_string(kMaxLoraGroup) + " members");
  for (int m = 0; m < n; ++m) check_sizes(T, in, r, g[m].out);
  if (use_fused()) {
    for (int m = 0; m < n; ++m)
      lora_backward(c, dx, g[m].dA, g[m].dB, g[m].dy, x, g[m].xa, g[m].A, g[m].B, g[m].scale, T, in, r, g[m].out,
                    nullptr);
    return;
  }
  dispatch(c.st, [&](auto tag) { gemm_group_backward<decltype(tag)>(c, dx, g, n, x, T, in, r); });
}

bool lora_concat_forward(const Ctx& c, const LoraMember* g, const void* const* W, int n, const void* x, int T, int in,
                         int r) {
  static const bool on = env::opt_in_logged(  // until a GPU has measured it
      "MGRL_LORA_CONCAT", "MGRL_LORA_CONCAT=1: a group's linears and adapters as one GEMM a member (concatenated "
                          "operands) where the outputs are wider than the input");
  if (!on || use_fused() || T <= 0 || r <= 0 || n <= 0 || n > kMaxLoraGroup || in <= 0) return false;
  long long outs = 0;
  for (int m = 0; m < n; ++m) {
    if (!g[m].y || !g[m].xa || !W[m] || g[m].out <= 0) return false;
    check_sizes(T, in, r, g[m].out);
    outs += g[m].out;
  }
  // The copy of x would cost what the read-modify-write of the outputs saves. Not counted (to weigh when a GPU has timed
  // the path): the copy of each W_m (2 out_m in elements a call), which makes it pay only from T > outs in / (outs -
  // in) tokens (~990 at Qwen2.5-0.5B's gate|up, ~4,000 at 7B's; kept inside the operand across calls, it would not
  // recur), and the zero columns of the other members that each member's GEMM runs over (k could stop at
  // in + 2 (m + 1) r).
  if (outs <= in) return false;
  dispatch(c.st, [&](auto tag) { gemm_concat_forward<decltype(tag)>(c, g, W, n, x, T, in, r); });
  return true;
}

namespace {

constexpr int kMergeRows = 64;  // output rows o of a block's tile
constexpr int kMergeCols = 64;  // input columns i of a block's tile (one per thread of a block row)
constexpr int kMergeK = 32;     // ranks k per shared-memory chunk
constexpr int kMergeThreads = 256;
constexpr int kMergeRowsPerThread = kMergeRows / (kMergeThreads / kMergeCols);  // 16

// grid (ceil(in / kMergeCols), ceil(out / kMergeRows)), block kMergeThreads. Thread (ty, tx) = (threadIdx.x /
// kMergeCols, threadIdx.x % kMergeCols) owns column i = i0 + tx and rows o = o0 + ty * kMergeRowsPerThread + j. Per
// chunk of ranks the block loads A[k, i0 ..] (coalesced along i) and B[o0 .., k] to shared memory; the sums run over
// k in increasing order with separately rounded products and adds (__fmul_rn / __fadd_rn: never contracted to an
// FMA), as the CPU reference does. Warps share ty, so their reads of Bs are broadcasts.
template <class S>
__global__ void __launch_bounds__(kMergeThreads) lora_merge_kernel(S* Wm, const S* W, const float* A, const float* B,
                                                                   float scale, int out, int in, int r) {
  __shared__ float As[kMergeK][kMergeCols];
  __shared__ float Bs[kMergeRows][kMergeK + 1];
  const int tx = threadIdx.x % kMergeCols, ty = threadIdx.x / kMergeCols;
  const int i0 = blockIdx.x * kMergeCols, o0 = blockIdx.y * kMergeRows;
  const int i = i0 + tx;
  float acc[kMergeRowsPerThread];
#pragma unroll
  for (int j = 0; j < kMergeRowsPerThread; ++j) acc[j] = 0.0f;
  for (int k0 = 0; k0 < r; k0 += kMergeK) {
    const int kc = min(kMergeK, r - k0);
    for (int e = threadIdx.x; e < kMergeK * kMergeCols; e += kMergeThreads) {
      const int kk = e / kMergeCols, ii = i0 + e % kMergeCols;
      As[kk][e % kMergeCols] = kk < kc && ii < in ? A[static_cast<std::int64_t>(k0 + kk) * in + ii] : 0.0f;
    }
    for (int e = threadIdx.x; e < kMergeRows * kMergeK; e += kMergeThreads) {
      const int oo = e / kMergeK, kk = e % kMergeK;
      Bs[oo][kk] = kk < kc && o0 + oo < out ? B[static_cast<std::int64_t>(o0 + oo) * r + k0 + kk] : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kc; ++kk) {
      const float a = As[kk][tx];
#pragma unroll
      for (int j = 0; j < kMergeRowsPerThread; ++j)
        acc[j] = __fadd_rn(acc[j], __fmul_rn(Bs[ty * kMergeRowsPerThread + j][kk], a));
    }
    __syncthreads();
  }
  if (i >= in) return;
#pragma unroll
  for (int j = 0; j < kMergeRowsPerThread; ++j) {
    const int o = o0 + ty * kMergeRowsPerThread + j;
    if (o < out) {
      const std::int64_t at = static_cast<std::int64_t>(o) * in + i;
      Wm[at] = from_f32<S>(__fadd_rn(to_f32(W[at]), __fmul_rn(scale, acc[j])));
    }
  }
}

}  // namespace

void lora_merge(const Ctx& c, void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in,
                int r) {
  if (out <= 0 || in <= 0) return;
  MGRL_CHECK(r >= 0 && (out + kMergeRows - 1) / kMergeRows <= 65535, "lora_merge: unsupported shape");
  const dim3 grid((in + kMergeCols - 1) / kMergeCols, (out + kMergeRows - 1) / kMergeRows);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    lora_merge_kernel<S><<<grid, kMergeThreads, 0, c.stream>>>(static_cast<S*>(Wm), static_cast<const S*>(W), A, B,
                                                               scale, out, in, r);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
