// flash_attention_sm70.cu: FlashAttention-2-style causal grouped-query attention over packed variable-length
// sequences on Volta's tensor cores (nvcuda::wmma, fp16 m16n16k16 with fp32 accumulators), head_dim 64 and 128, fp16
// storage. Semantics: kernels/cpu/attention.h; conventions (lse and D [n_heads, T], scratch, determinism) those of
// flash_attention.cu, whose dsum and GQA reduce kernels the backward reuses.
//
// wmma works on whole-warp fragments whose element-to-lane layout is unspecified (and differs between sm_70 and the
// sm_80+ GPUs that JIT-compile this code), so nothing here depends on it: every product's accumulators go to the
// warp's fp32 scratch in shared memory (store_matrix_sync), the lanes read them back in a layout of our own (that of
// mma.sync's accumulators: flash_attention_sm70_plan.h, val_row / val_col) for the softmax and masking, and write
// P or dS as fp16 in place over the scratch rows they came from, where the next product loads them as matrix_a.
// Sums that need no per-row rescaling (dQ, dK, dV) stay in accumulator fragments for the whole loop and go through
// shared memory once at the end; the forward's O, rescaled per row at every key tile, lives in registers in the
// lane layout and adds each tile's P V from the scratch.
//
// Every kernel runs 4 warps (128 threads) on 64 rows, 16 rows a warp. Tiles are staged into shared memory with
// 16-byte loads (Volta has no cp.async), single-buffered, rows padded to head_dim + 8 (wmma needs 32-byte aligned
// fragment addresses: 16 rows of head_dim + 8 halves are 32 (head_dim + 8) bytes). Tile rows and shared-memory
// layouts: flash_attention_sm70_plan.h (checked on the CPU by tests/unit/test_attention_sm70_plan.cpp).
//
//   forward  grid (B * n_heads, ceil(max_len / 64) query blocks), last query block first. Key/value tiles of 64
//            rows (head_dim 128: 32) from key 0 up to the block's last valid query (causal tile skipping; only tiles
//            reaching past a warp's first row are masked). Per tile and warp: S = Q K^T (16 x tile) -> scratch ->
//            lanes: online softmax in fp32, base 2 (scores times scale * log2 e), P rounded to fp16 in place -> P
//            into fragments -> per 64 (head_dim 128: 32) output columns P V -> scratch -> O = alpha O + P V in
//            registers. Writes out = O / l and lse = (m + log2 l) ln 2 for rows below the sequence's length.
//   backward (1) D = rowsum(dout * out) (flash_attention_dsum).
//            (2) dq: grid as the forward; key tiles of 32 rows; S = Q K^T, dP = dO V^T -> scratch -> lanes:
//                P = exp2(s scale log2 e - lse log2 e) (masked), dS = P (dP - D) in fp16 in place -> dQ += dS K
//                (fragments); at the end dQ * scale through shared memory into dq.
//            (3) dkv: grid (B * n_heads, ceil(max_len / 64) key blocks), first key block first; query tiles of 32
//                rows (with their lse and D) from the block's first key to the sequence end; S^T = K Q^T,
//                dP^T = V dO^T -> scratch -> P^T and dS^T in fp16 in place -> dV += P^T dO, dK += dS^T Q
//                (fragments); at the end into dk/dv (n_heads == n_kv) or the fp32 per-head partials that
//                flash_attention_reduce_kv sums over each group in head order. No atomics: deterministic.
// Packing: sequence b is rows row0 = cu_seqlens[b] .. row0 + len - 1 (checked by seq_rows: malformed entries set
// kErrLength and the sequence is treated as empty); every load, mask and store is bounded by len: tile rows at or
// past len are zero-filled in shared memory (not read from global memory), masked out of every sum, and not stored.
#include "kernels/cuda/flash_attention_sm70.cuh"

#include <mma.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_sm70_plan.h"

namespace mgrl::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using sm70::kDkvM;
using sm70::kDqN;
using sm70::kRows;
using sm70::val_col;
using sm70::val_row;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;  // B given by its rows' transpose
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// ---- device helpers ----

// Rows [0, R) of a tile of D halves into shared memory at pitch D + 8: row r from g + r * gstride for r < nvalid,
// zeros otherwise (g is then not read). 16-byte copies by the whole block.
template <int R, int D>
__device__ __forceinline__ void load_tile(__half* s, const __half* g, std::int64_t gstride, int nvalid) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < R * kChunks; c += sm70::kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < nvalid) val = *reinterpret_cast<const uint4*>(g + r * gstride + col);
    *reinterpret_cast<uint4*>(s + r * sm70::tile_pitch(D) + col) = val;
  }
}

// acc[n] = A B_n^T for n < N16: A is 16 rows (row-major halves at a, pitch lda, 16 * K16 columns), B_n rows
// [16 n, 16 n + 16) of bt (row-major halves, pitch ldb). S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T.
template <int K16, int N16>
__device__ __forceinline__ void mma_abt(FragC (&acc)[N16], const __half* a, int lda, const __half* bt, int ldb) {
#pragma unroll
  for (int n = 0; n < N16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < N16; ++n) {
      FragBt fb;  // element (k, j) at bt[(16 n + j) * ldb + 16 kk + k]
      wmma::load_matrix_sync(fb, bt + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// acc[n] += A B[:, 16 n .. 16 n + 16) for n < N16: A is 16 rows (row-major halves at a, pitch lda, 16 * K16
// columns), B row-major halves at b (pitch ldb, 16 * K16 rows). dQ += dS K, dV += P^T dO, dK += dS^T Q.
template <int K16, int N16>
__device__ __forceinline__ void mma_ab(FragC (&acc)[N16], const __half* a, int lda, const __half* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < N16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Accumulators of a 16 x 16 N16 product into the warp's fp32 scratch rows (pitch sp).
template <int N16>
__device__ __forceinline__ void store_acc(float* sc, int sp, const FragC (&acc)[N16]) {
#pragma unroll
  for (int n = 0; n < N16; ++n) wmma::store_matrix_sync(sc + n * 16, acc[n], sp, wmma::mem_row_major);
}

// The lane's values of a warp's 16 x 8 N8 fp32 scratch rows (pitch sp), in the layout of val_row / val_col:
// x[n][e] = sc[val_row(lane, e)][val_col(lane, n, e)].
template <int N8>
__device__ __forceinline__ void read_vals(float (&x)[N8][4], const float* sc, int sp, int lane) {
#pragma unroll
  for (int n = 0; n < N8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float2 f = *reinterpret_cast<const float2*>(sc + val_row(lane, 2 * r) * sp + val_col(lane, n, 0));
      x[n][2 * r] = f.x;
      x[n][2 * r + 1] = f.y;
    }
}

// The lane's values rounded to fp16 into the same warp's scratch rows seen as halves (row r at sc + r * 2 sp
// floats' worth of halves: the first 8 N8 halves of the fp32 row they were read from). Call after every lane has
// read the rows (__syncwarp), since the halves overwrite the floats.
template <int N8>
__device__ __forceinline__ void write_halves(__half* sh, int sp, const float (&x)[N8][4], int lane) {
#pragma unroll
  for (int n = 0; n < N8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<__half2*>(sh + val_row(lane, 2 * r) * 2 * sp + val_col(lane, n, 0)) =
          __floats2half2_rn(x[n][2 * r], x[n][2 * r + 1]);
}

// Row sums and maxima over the 4 lanes of a quad (the lanes holding one row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---- forward ----
// grid (B * n_heads, ceil(max_len / 64)), 128 threads, fwd_smem(D).bytes. Block (b * n_heads + h, query block from
// q0): reads q rows row0 + [q0, q_end) and k/v rows row0 + [0, q_end) with q_end = min(q0 + 64, len); writes out
// rows row0 + [q0, q_end) (head h) and lse[h * T + row0 + [q0, q_end)]. Launch bounds ask for two blocks an SM (at
// most 255 registers: what Volta's 96 KB fit; without it sm_90's ptxas chose 128 registers and spilled).
template <int D>
__global__ void __launch_bounds__(sm70::kThreads, 2)
    sm70_forward_kernel(__half* out, float* lse, const __half* q, const __half* k, const __half* v,
                        const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                        float scale_log2, int* err) {
  constexpr sm70::Smem L = sm70::fwd_smem(D);
  constexpr int BN = sm70::fwd_tile(D), kChunk = sm70::fwd_chunk(D), P = sm70::tile_pitch(D), K16 = D / 16;
  constexpr int SP = L.s_pitch;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Qs = reinterpret_cast<__half*>(smem + L.q);  // [64][P]
  __half* Ks = reinterpret_cast<__half*>(smem + L.k);  // [BN][P]
  __half* Vs = reinterpret_cast<__half*>(smem + L.v);  // [BN][P]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* Sc = reinterpret_cast<float*>(smem + L.s) + warp * 16 * SP;  // this warp's [16][SP] fp32 scratch
  __half* Ph = reinterpret_cast<__half*>(Sc);                          // P over it: row r at Ph + r * 2 SP
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int q0 = sm70::query_block_start(blockIdx.y, gridDim.y);
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (q0 >= len) return;  // no query of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // lse of position t at lse_h[t]
  const int q_end = min(q0 + kRows, len);                        // valid query rows [q0, q_end)
  const int n_tiles = sm70::key_tiles(q0, len, BN);
  const __half* kg = k + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  const __half* vg = v + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Qs, q + (row0 + q0) * qstride + static_cast<std::int64_t>(h) * D, qstride, q_end - q0);

  float o[D / 8][4];  // O of the lane's rows in the val_row / val_col layout over D columns
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int wrow = q0 + warp * 16;          // the warp's first query row
  const int trow = wrow + val_row(lane, 0);  // this lane's rows: trow and trow + 8
  for (int j = 0; j < n_tiles; ++j) {
    const int kbase = j * BN;
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tile<BN, D>(Ks, kg + kbase * kstride, kstride, min(BN, len - kbase));
    load_tile<BN, D>(Vs, vg + kbase * kstride, kstride, min(BN, len - kbase));
    __syncthreads();

    {
      FragC sacc[BN / 16];
      mma_abt<K16, BN / 16>(sacc, Qs + warp * 16 * P, P, Ks, P);  // S = Q K^T
      store_acc<BN / 16>(Sc, SP, sacc);
    }
    __syncwarp();
    float s[BN / 8][4];
    read_vals<BN / 8>(s, Sc, SP, lane);
    if (sm70::key_tile_masked(kbase, BN, wrow)) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kbase + val_col(lane, n, e) > trow + 8 * (e >> 1)) s[n][e] = -INFINITY;
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(m[r], mx * scale_log2);
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - base);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * r] = exp2f(fmaf(s[n][2 * r], scale_log2, -base));
        s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], scale_log2, -base));
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + sum;  // this lane's columns only; summed over the quad at the end
    }
    __syncwarp();  // every lane has read S before P overwrites it
    write_halves<BN / 8>(Ph, SP, s, lane);
    __syncwarp();
    FragA pf[BN / 16];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wmma::load_matrix_sync(pf[kk], Ph + kk * 16, 2 * SP);
    __syncwarp();  // P is in fragments before P V overwrites the scratch
#pragma unroll
    for (int c = 0; c < D / kChunk; ++c) {
      FragC pv[kChunk / 16];
#pragma unroll
      for (int n = 0; n < kChunk / 16; ++n) wmma::fill_fragment(pv[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int n = 0; n < kChunk / 16; ++n) {
          FragB vb;
          wmma::load_matrix_sync(vb, Vs + kk * 16 * P + c * kChunk + n * 16, P);
          wmma::mma_sync(pv[n], pf[kk], vb, pv[n]);
        }
      store_acc<kChunk / 16>(Sc, SP, pv);
      __syncwarp();
      float x[kChunk / 8][4];
      read_vals<kChunk / 8>(x, Sc, SP, lane);
#pragma unroll
      for (int n = 0; n < kChunk / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& oe = o[c * (kChunk / 8) + n][e];
          oe = fmaf(oe, alpha[e >> 1], x[n][e]);
        }
      __syncwarp();  // every lane has read P V before the next product overwrites the scratch
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lsum = quad_sum(l[r]);  // every lane of the quad takes part (before the row test)
    const int t = trow + 8 * r;
    if (t >= len) continue;  // past the sequence: the next sequence's row (or past T), not ours
    const float inv = 1.0f / lsum;
    __half* orow = out + (row0 + t) * qstride + static_cast<std::int64_t>(h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<__half2*>(orow + val_col(lane, n, 0)) =
          __floats2half2_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    if ((lane & 3) == 0) lse_h[t] = (m[r] + log2f(lsum)) * kLn2;
  }
}

// ---- backward ----

// The warp's fp32 accumulators acc (16 x D) through its staging rows st (pitch D + 8) into rows of a global
// tensor: for the lane's rows i (val_row) with row_pos0 + i < len, dst + (row_pos0 + i) * stride gets the 16 x D
// values times mul, as fp16 (dst16) or fp32 (dst32; exactly one of them non-null).
template <int D>
__device__ __forceinline__ void store_rows(const FragC (&acc)[D / 16], float* st, __half* dst16, float* dst32,
                                           std::int64_t stride, int row_pos0, int len, float mul, int lane) {
  constexpr int SP = sm70::tile_pitch(D);
  __syncwarp();  // the previous use of the staging rows is over
  store_acc<D / 16>(st, SP, acc);
  __syncwarp();
  float x[D / 8][4];
  read_vals<D / 8>(x, st, SP, lane);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pos = row_pos0 + val_row(lane, 2 * r);
    if (pos >= len) continue;  // past the sequence: not ours
    const std::int64_t off = static_cast<std::int64_t>(pos) * stride;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const float a = x[n][2 * r] * mul, c = x[n][2 * r + 1] * mul;
      if (dst16 != nullptr)
        *reinterpret_cast<__half2*>(dst16 + off + val_col(lane, n, 0)) = __floats2half2_rn(a, c);
      else
        *reinterpret_cast<float2*>(dst32 + off + val_col(lane, n, 0)) = make_float2(a, c);
    }
  }
}

// grid (B * n_heads, ceil(max_len / 64)), 128 threads, dq_smem(D).bytes. dq of the block's 64 query positions: reads
// q/dout rows row0 + [q0, q_end), their lse/D at h * T + row0 + [q0, q_end), k/v rows row0 + [0, q_end); writes dq
// rows row0 + [q0, q_end) (head h), q_end = min(q0 + 64, len).
template <int D>
__global__ void __launch_bounds__(sm70::kThreads) sm70_dq_kernel(__half* dq, const __half* dout, const __half* q,
                                                           const __half* k, const __half* v, const float* lse,
                                                           const float* Dsum, const std::int32_t* cu_seqlens, int B,
                                                           int T, int max_len, int n_heads, int n_kv, float scale,
                                                           float scale_log2, int* err) {
  constexpr sm70::Smem L = sm70::dq_smem(D);
  constexpr int BN = kDqN, P = sm70::tile_pitch(D), K16 = D / 16, SP = L.s_pitch;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Qs = reinterpret_cast<__half*>(smem + L.q);  // [64][P]
  __half* Gs = reinterpret_cast<__half*>(smem + L.g);  // dO [64][P]
  __half* Ks = reinterpret_cast<__half*>(smem + L.k);  // [BN][P]
  __half* Vs = reinterpret_cast<__half*>(smem + L.v);  // [BN][P]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* Sc = reinterpret_cast<float*>(smem + L.s) + warp * 16 * SP;   // S, then dS (fp16) over it
  float* DPc = reinterpret_cast<float*>(smem + L.dp) + warp * 16 * SP;  // dP
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int q0 = sm70::query_block_start(blockIdx.y, gridDim.y);
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (q0 >= len) return;  // no query of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  const std::int64_t qoff = (row0 + q0) * qstride + static_cast<std::int64_t>(h) * D;
  const int q_end = min(q0 + kRows, len);
  const int n_tiles = sm70::key_tiles(q0, len, BN);
  const __half* kg = k + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  const __half* vg = v + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Qs, q + qoff, qstride, q_end - q0);
  load_tile<kRows, D>(Gs, dout + qoff, qstride, q_end - q0);

  const int wrow = q0 + warp * 16;
  const int trow = wrow + val_row(lane, 0);
  const float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // position t at lse_h[t], D_h[t]
  const float* D_h = Dsum + static_cast<std::int64_t>(h) * T + row0;
  float lse2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = trow + 8 * r;
    lse2[r] = t < len ? lse_h[t] * kLog2e : 0.0f;
    Dr[r] = t < len ? D_h[t] : 0.0f;
  }
  FragC acc[D / 16];  // dQ / scale, 16 x D
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int j = 0; j < n_tiles; ++j) {
    const int kbase = j * BN;
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tile<BN, D>(Ks, kg + kbase * kstride, kstride, min(BN, len - kbase));
    load_tile<BN, D>(Vs, vg + kbase * kstride, kstride, min(BN, len - kbase));
    __syncthreads();
    {
      FragC sacc[BN / 16];
      mma_abt<K16, BN / 16>(sacc, Qs + warp * 16 * P, P, Ks, P);  // S = Q K^T
      store_acc<BN / 16>(Sc, SP, sacc);
      mma_abt<K16, BN / 16>(sacc, Gs + warp * 16 * P, P, Vs, P);  // dP = dO V^T
      store_acc<BN / 16>(DPc, SP, sacc);
    }
    __syncwarp();
    float s[BN / 8][4], dp[BN / 8][4];
    read_vals<BN / 8>(s, Sc, SP, lane);
    read_vals<BN / 8>(dp, DPc, SP, lane);
    const bool masked = sm70::key_tile_masked(kbase, BN, wrow);
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = exp2f(fmaf(s[n][e], scale_log2, -lse2[r]));
        if (masked && kbase + val_col(lane, n, e) > trow + 8 * r) p = 0.0f;
        s[n][e] = p * (dp[n][e] - Dr[r]);  // dS (without the scale)
      }
    __syncwarp();  // every lane has read S before dS overwrites it
    write_halves<BN / 8>(reinterpret_cast<__half*>(Sc), SP, s, lane);
    __syncwarp();
    mma_ab<BN / 16, D / 16>(acc, reinterpret_cast<const __half*>(Sc), 2 * SP, Ks, P);  // dQ += dS K
  }

  __syncthreads();  // every warp is done with Q/dO: the staging rows lie over them
  float* st = reinterpret_cast<float*>(smem + L.stage) + warp * 16 * sm70::tile_pitch(D);
  store_rows<D>(acc, st, dq + row0 * qstride + static_cast<std::int64_t>(h) * D, nullptr, qstride, wrow, len, scale,
                lane);
}

// grid (B * n_heads, ceil(max_len / 64)), 128 threads, dkv_smem(D).bytes. dk/dv of the block's 64 key positions from
// query head h: into dk/dv (fp16) when part_k is null (n_heads == n_kv), else into the fp32 partials part_k/part_v
// [T, n_heads, D]. Reads k/v rows row0 + [k0, min(k0 + 64, len)), q/dout rows row0 + [k0, len) (query tiles from
// the one holding k0) and their lse/D at h * T + row0 + the same; writes rows row0 + [k0, min(k0 + 64, len)) of
// dk/dv (kv head) or of the partials (head h).
template <int D>
__global__ void __launch_bounds__(sm70::kThreads) sm70_dkv_kernel(__half* dk, __half* dv, float* part_k, float* part_v,
                                                            const __half* dout, const __half* q, const __half* k,
                                                            const __half* v, const float* lse, const float* Dsum,
                                                            const std::int32_t* cu_seqlens, int B, int T,
                                                            int max_len, int n_heads, int n_kv, float scale,
                                                            float scale_log2, int* err) {
  constexpr sm70::Smem L = sm70::dkv_smem(D);
  constexpr int BM = kDkvM, P = sm70::tile_pitch(D), K16 = D / 16, SP = L.s_pitch;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Ks = reinterpret_cast<__half*>(smem + L.k);  // [64][P]
  __half* Vs = reinterpret_cast<__half*>(smem + L.v);  // [64][P]
  __half* Qs = reinterpret_cast<__half*>(smem + L.q);  // [BM][P]
  __half* Gs = reinterpret_cast<__half*>(smem + L.g);  // dO [BM][P]
  float* Ls = reinterpret_cast<float*>(smem + L.ls);   // lse * log2 e [BM]
  float* Ds = reinterpret_cast<float*>(smem + L.ds);   // D [BM]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* Sc = reinterpret_cast<float*>(smem + L.s) + warp * 16 * SP;    // S^T, then P^T (fp16) over it
  float* DPc = reinterpret_cast<float*>(smem + L.dp) + warp * 16 * SP;  // dP^T, then dS^T (fp16) over it
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int k0 = sm70::key_block_start(blockIdx.y);
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (k0 >= len) return;  // no key of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  const int wkey0 = k0 + warp * 16;           // the warp's first key
  const int krow = wkey0 + val_row(lane, 0);  // this lane's keys: krow and krow + 8
  const int i_begin = sm70::query_tile_begin(k0, BM), i_end = sm70::query_tile_end(len, BM);
  const __half* qg = q + row0 * qstride + static_cast<std::int64_t>(h) * D;
  const __half* gg = dout + row0 * qstride + static_cast<std::int64_t>(h) * D;
  const float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // position t at lse_h[t], D_h[t]
  const float* D_h = Dsum + static_cast<std::int64_t>(h) * T + row0;
  const std::int64_t koff = (row0 + k0) * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Ks, k + koff, kstride, min(kRows, len - k0));
  load_tile<kRows, D>(Vs, v + koff, kstride, min(kRows, len - k0));

  FragC ak[D / 16], av[D / 16];  // dK / scale and dV of the warp's 16 keys
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(ak[n], 0.0f);
    wmma::fill_fragment(av[n], 0.0f);
  }
  for (int i = i_begin; i < i_end; ++i) {
    const int t0 = i * BM;
    __syncthreads();  // every warp is done with the previous Q/dO tile and its lse/D
    load_tile<BM, D>(Qs, qg + t0 * qstride, qstride, min(BM, len - t0));
    load_tile<BM, D>(Gs, gg + t0 * qstride, qstride, min(BM, len - t0));
    for (int r = threadIdx.x; r < BM; r += sm70::kThreads) {
      const int t = t0 + r;
      Ls[r] = t < len ? lse_h[t] * kLog2e : 0.0f;
      Ds[r] = t < len ? D_h[t] : 0.0f;
    }
    __syncthreads();
    {
      FragC sacc[BM / 16];
      mma_abt<K16, BM / 16>(sacc, Ks + warp * 16 * P, P, Qs, P);  // S^T = K Q^T
      store_acc<BM / 16>(Sc, SP, sacc);
      mma_abt<K16, BM / 16>(sacc, Vs + warp * 16 * P, P, Gs, P);  // dP^T = V dO^T
      store_acc<BM / 16>(DPc, SP, sacc);
    }
    __syncwarp();
    float s[BM / 8][4], dp[BM / 8][4];
    read_vals<BM / 8>(s, Sc, SP, lane);
    read_vals<BM / 8>(dp, DPc, SP, lane);
    // Queries t < u (causal) or t >= len (another sequence's rows, zero-filled in shared memory) are out of every
    // sum.
    const bool masked = sm70::query_tile_masked(t0, BM, wkey0, len);
#pragma unroll
    for (int n = 0; n < BM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ti = val_col(lane, n, e);  // query within the tile
        float p = exp2f(fmaf(s[n][e], scale_log2, -Ls[ti]));
        if (masked) {
          const int t = t0 + ti;
          if (t < krow + 8 * (e >> 1) || t >= len) p = 0.0f;
        }
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Ds[ti]);  // dS^T (without the scale)
      }
    __syncwarp();  // every lane has read S^T and dP^T before P^T and dS^T overwrite them
    write_halves<BM / 8>(reinterpret_cast<__half*>(Sc), SP, s, lane);
    write_halves<BM / 8>(reinterpret_cast<__half*>(DPc), SP, dp, lane);
    __syncwarp();
    mma_ab<BM / 16, D / 16>(av, reinterpret_cast<const __half*>(Sc), 2 * SP, Gs, P);   // dV += P^T dO
    mma_ab<BM / 16, D / 16>(ak, reinterpret_cast<const __half*>(DPc), 2 * SP, Qs, P);  // dK += dS^T Q
  }

  __syncthreads();  // every warp is done with K/V: the staging rows lie over them
  float* st = reinterpret_cast<float*>(smem + L.stage) + warp * 16 * sm70::tile_pitch(D);
  if (part_k == nullptr) {
    const std::int64_t off = row0 * kstride + static_cast<std::int64_t>(kvh) * D;
    store_rows<D>(ak, st, dk + off, nullptr, kstride, wkey0, len, scale, lane);
    store_rows<D>(av, st, dv + off, nullptr, kstride, wkey0, len, 1.0f, lane);
  } else {
    const std::int64_t off = row0 * qstride + static_cast<std::int64_t>(h) * D;
    store_rows<D>(ak, st, nullptr, part_k + off, qstride, wkey0, len, scale, lane);
    store_rows<D>(av, st, nullptr, part_v + off, qstride, wkey0, len, 1.0f, lane);
  }
}

// ---- host side ----

// Calls f(std::integral_constant<int, D>) for the call's head_dim (64 or 128).
template <class F>
void with_dim(int head_dim, F&& f) {
  if (head_dim == 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

}  // namespace

bool flash_attention_sm70_forced() { return attention_selector() == "sm70"; }

bool flash_attention_sm70_applies(DType st, int head_dim, std::initializer_list<const void*> tensors) {
  if (st != DType::F16 || (head_dim != 64 && head_dim != 128)) return false;
  if (attention_selector() == "naive") return false;
  for (const void* p : tensors)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return device_facts().major >= 7 && device_facts().smem_optin >= sm70::max_smem(head_dim);
}

void flash_attention_sm70_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                                  const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                                  int head_dim) {
  if (T == 0) return;  // (then grid.y could be 0)
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(head_dim));
  const dim3 grid(static_cast<unsigned>(B * n_heads), static_cast<unsigned>((max_len + kRows - 1) / kRows));
  with_dim(head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr int bytes = sm70::fwd_smem(D).bytes;
    auto kern = sm70_forward_kernel<D>;
    allow_smem(kern, bytes);
    kern<<<grid, sm70::kThreads, bytes, c.stream>>>(static_cast<__half*>(out), lse, static_cast<const __half*>(q),
                                              static_cast<const __half*>(k), static_cast<const __half*>(v),
                                              cu_seqlens, B, T, max_len, n_heads, n_kv, scale_log2, c.err);
    CUDA_CHECK_LAUNCH();
  });
}

void flash_attention_sm70_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out,
                                   const void* q, const void* k, const void* v, const float* lse,
                                   const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                                   int head_dim) {
  if (T == 0) return;  // (then grid.y could be 0)
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const float scale_log2 = kLog2e * scale;
  const int group = n_heads / n_kv;
  const dim3 grid(static_cast<unsigned>(B * n_heads), static_cast<unsigned>((max_len + kRows - 1) / kRows));
  float* Dsum = static_cast<float*>(
      scratch_alloc(sizeof(float) * static_cast<std::size_t>(T) * static_cast<std::size_t>(n_heads), c.stream));
  float* part = nullptr;
  const std::size_t part_n = static_cast<std::size_t>(T) * n_heads * head_dim;  // [T, n_heads, head_dim]
  if (group > 1) part = static_cast<float*>(scratch_alloc(2 * sizeof(float) * part_n, c.stream));
  flash_attention_dsum(c, Dsum, dout, out, T, n_heads, head_dim);
  with_dim(head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr int dq_bytes = sm70::dq_smem(D).bytes, dkv_bytes = sm70::dkv_smem(D).bytes;
    auto kq = sm70_dq_kernel<D>;
    allow_smem(kq, dq_bytes);
    kq<<<grid, sm70::kThreads, dq_bytes, c.stream>>>(static_cast<__half*>(dq), static_cast<const __half*>(dout),
                                               static_cast<const __half*>(q), static_cast<const __half*>(k),
                                               static_cast<const __half*>(v), lse, Dsum, cu_seqlens, B, T, max_len,
                                               n_heads, n_kv, scale, scale_log2, c.err);
    CUDA_CHECK_LAUNCH();
    auto kkv = sm70_dkv_kernel<D>;
    allow_smem(kkv, dkv_bytes);
    kkv<<<grid, sm70::kThreads, dkv_bytes, c.stream>>>(
        static_cast<__half*>(dk), static_cast<__half*>(dv), part, part ? part + part_n : nullptr,
        static_cast<const __half*>(dout), static_cast<const __half*>(q), static_cast<const __half*>(k),
        static_cast<const __half*>(v), lse, Dsum, cu_seqlens, B, T, max_len, n_heads, n_kv, scale, scale_log2,
        c.err);
    CUDA_CHECK_LAUNCH();
  });
  if (part) {
    flash_attention_reduce_kv(c, dk, dv, part, part + part_n, T, n_kv, group, head_dim);
    scratch_free(part, c.stream);
  }
  scratch_free(Dsum, c.stream);
}

}  // namespace mgrl::kernels::cuda
