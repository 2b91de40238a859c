// lora.cu: fused LoRA adapter kernels, y += scale * (x @ A^T) @ B^T, and its backward (dA, dB, added dx).
//
// Three kernel shapes cover the five products (r = rank, small):
//   rowdot  out[t, j]  = alpha * sum_i X[t, i] * M[j, i]         xa = x A^T;  dxa = scale * dy B (B transposed first)
//   addmm   Y[t, c]   += alpha * sum_j Z[t, j] * M(c, j)         y += scale * xa B^T;  dx += dxa A
//   outer   D(c, j)   += alpha * sum_t Y[t, c] * Z[t, j]         dB += scale * dy^T xa;  dA += dxa^T x
// X, Y are storage-dtype activations, Z, M, D f32. All sums in fp32.
#include "kernels/cuda/lora.cuh"

#include <string>

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

}  // namespace

void lora_forward(const Ctx& c, void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                  int in, int r, int out) {
  if (T <= 0 || r <= 0) return;
  check_sizes(T, in, r, out);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
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

}  // namespace mgrl::kernels::cuda
