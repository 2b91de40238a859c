// flash_attention.cu: FlashAttention-2-style causal grouped-query attention over packed variable-length sequences
// on tensor cores, head_dim 64 and 128, bf16 or fp16 storage, fp32 accumulation. Semantics: kernels/cpu/attention.h,
// with its AttentionOptions: a score scale, a sliding window (key tiles wholly outside every row's window are
// skipped, the others masked) and soft-capping of the scores (applied to the raw q . k in fp32 before the mask; the
// backward multiplies dS by the tanh's derivative).
//
// Every kernel runs 4 warps (128 threads); a warp owns 16 rows of its tile and keeps them in registers in the
// layouts of mma.sync m16n8k16 (row.col, fp32 accumulators), so softmax and the products chain without going
// through shared memory: an accumulator tile of S (or dS) becomes the A operand of the next product as is.
// Operands come from shared memory with ldmatrix (.trans where the product needs the tile transposed). Tiles are
// staged by cp.async (sm_80+; plain 16-byte copies on sm_75), double-buffered: the next tile loads while this one
// is computed. Shared rows are padded to head_dim + 8 elements, which keeps ldmatrix free of bank conflicts.
//
//   forward   grid (B * n_heads, ceil(max_len / 64) query blocks), heaviest (last) query block first; a block whose
//             first query is at or past its sequence's length exits at once (before any barrier). The Q tile goes
//             to registers once; key/value tiles of kFwdN rows stream through shared memory up to the diagonal
//             (causal tile skipping; only tiles reaching past a warp's first row are masked). Online softmax in
//             fp32, base 2 (scores pre-multiplied by scale * log2 e); P is rounded to the storage type for P V.
//             Writes out = O / l and lse = (m + log2 l) ln 2 for the block's rows below the sequence's length.
//   backward  (1) dsum: one warp per (token row, head) of all T rows, D = rowsum(dout * out) into [n_heads, T].
//             (2) dq: grid as the forward; Q and dO fragments in registers; per key tile recompute
//                 P = exp2(s * scale log2 e - lse log2 e), dP = dO V^T, dS = P (dP - D), dQ += dS K.
//             (3) dkv: grid (B * n_heads, ceil(max_len / 64) key blocks), heaviest (first) key block first (blocks
//                 past the sequence's length exit at once); each warp owns 16
//                 keys; query tiles of kDkvM rows (with their lse and D) stream from the diagonal to the sequence
//                 end; S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, all in registers.
//             (4) when n_heads > n_kv, (3) writes per-query-head fp32 partials and a reduce kernel sums each
//                 group's heads in a fixed order into dk/dv. No atomics anywhere: the backward is deterministic.
// Packing: sequence b is rows row0 = cu_seqlens[b] .. row0 + len - 1; a block works on positions relative to row0 and
// bounds every load, mask and store by len, never by the tile or the grid: tile rows at positions >= len (which
// are the next sequence's rows, or past T) are not read from global memory (cp.async zero-fills them in shared
// memory), are masked out of every sum, and are not written. lse and D are [n_heads, T]: row t of head h at
// h * T + t.
//
// Architectures: mma.sync m16n8k16 on sm_80+ (bf16 and fp16); on sm_75 (fp16 only) each m16n8k16 is two m16n8k8.
// MGRL_CUDA_ATTENTION=mma_k8 forces the m16n8k8 form for fp16 on newer GPUs too (so tests cover sm_75's code).
#include "kernels/cuda/flash_attention.cuh"

#include "kernels/cuda/attention.cuh"

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace mgrl::kernels::cuda {
namespace {

constexpr int kFaWarps = 4;
constexpr int kFaThreads = 32 * kFaWarps;
constexpr int kRows = 16 * kFaWarps;  // query rows of a forward / dq block, key rows of a dkv block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile sizes by head_dim (rows of the streamed tiles). head_dim 128 streams smaller tiles in the backward to stay
// within 255 registers per thread.
template <int D>
struct Tiles;
template <>
struct Tiles<64> {
  static constexpr int kFwdN = 64, kDqN = 64, kDkvM = 64;
};
template <>
struct Tiles<128> {
  static constexpr int kFwdN = 64, kDqN = 32, kDkvM = 32;
};

template <int D>
__host__ __device__ constexpr int pitch() {  // shared row pitch in elements
  return D + 8;
}
template <int D>
constexpr int fwd_smem() {  // Q [64], K/V [2 stages][kFwdN]
  return (kRows + 4 * Tiles<D>::kFwdN) * pitch<D>() * 2;
}
template <int D>
constexpr int dq_smem() {  // Q, dO [64], K/V [2][kDqN]
  return (2 * kRows + 4 * Tiles<D>::kDqN) * pitch<D>() * 2;
}
template <int D>
constexpr int dkv_smem() {  // K, V [64], Q/dO [2][kDkvM], lse/D [2][kDkvM] floats
  return (2 * kRows + 4 * Tiles<D>::kDkvM) * pitch<D>() * 2 + 4 * Tiles<D>::kDkvM * 4;
}

// ---- device helpers ----

template <class S>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// c += a b for a 16x16 A tile (row major, 4 registers) and a 16x8 B tile ("col": 2 registers), fp32 c.
template <class S, bool kK8>
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  constexpr bool kBf16 = std::is_same_v<S, __nv_bfloat16>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (!kK8) {
    if constexpr (kBf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    return;
  }
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
    return;
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  if constexpr (!kBf16) {
    // k = 0..7 are a0/a1 and b0, k = 8..15 are a2/a3 and b1.
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
    return;
  }
#endif
#if defined(__CUDA_ARCH__)
  __trap();  // not launched on this architecture (flash_attention_applies)
#endif
}

// Four 8x8 b16 matrices from shared memory; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#elif defined(__CUDA_ARCH__)
  (void)p;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}
__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#elif defined(__CUDA_ARCH__)
  (void)p;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// 16 bytes global -> shared, zero-filled when !valid (g is then not read).
__device__ __forceinline__ void cp16(void* s, const void* g, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(s));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(valid ? 16 : 0));
#else
  *static_cast<uint4*>(s) = valid ? *static_cast<const uint4*>(g) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Rows [0, R) of a tile into shared memory (pitch D + 8): row r is g + r * gstride, valid for r < nvalid (zeros
// otherwise).
template <int R, int D, class S>
__device__ __forceinline__ void load_tile(S* s, const S* g, std::int64_t gstride, int nvalid) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < R * kChunks; c += kFaThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < nvalid;
    cp16(s + r * pitch<D>() + col, ok ? g + r * gstride + col : g, ok);
  }
}

// Shared-memory addresses a lane passes to ldmatrix.x4 for a 16x16 tile at (row0, col0) of a pitch-P tile:
//  a_addr: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (0-7, 8-15), (8-15, 8-15): the A fragment of a
//          row-major tile; with .trans, the B fragments (b0, b1) of two 8-column groups of a [k][n] tile.
//  b_addr: matrices (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): the B fragments (b0, b1) of two
//          8-row groups of an [n][k] tile (rows = n).
template <int P, class S>
__device__ __forceinline__ const S* a_addr(const S* t, int row0, int col0, int lane) {
  return t + (row0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P + col0 + ((lane >> 4) << 3);
}
template <int P, class S>
__device__ __forceinline__ const S* b_addr(const S* t, int row0, int col0, int lane) {
  return t + (row0 + (lane & 7) + ((lane >> 4) << 3)) * P + col0 + (((lane >> 3) & 1) << 3);
}

// acc[16 x 8N] += A (16 x 16K, fragments in registers) times the transpose of rows [0, 8N) of shared tile T
// ([8N][16K], pitch P): S = Q K^T and friends.
template <class S, bool kK8, int K16, int N8, int P>
__device__ __forceinline__ void mma_abt(float (&acc)[N8][4], const std::uint32_t (&a)[K16][4], const S* T, int lane) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
#pragma unroll
    for (int np = 0; np < N8 / 2; ++np) {
      std::uint32_t b[4];
      ldsm_x4(b, b_addr<P>(T, np * 16, kk * 16, lane));
      mma16816<S, kK8>(acc[2 * np], a[kk], b[0], b[1]);
      mma16816<S, kK8>(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
  }
}

// acc[16 x 8N] += P (16 x 16K, given as fp32 accumulator tiles p[2K][4], rounded to S) times rows [0, 16K) of
// shared tile T ([16K][8N], pitch P): O += P V and friends.
template <class S, bool kK8, int K16, int N8, int P>
__device__ __forceinline__ void mma_pb(float (&acc)[N8][4], const float (&p)[2 * K16][4], const S* T, int lane) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    const std::uint32_t a[4] = {pack2<S>(p[2 * kk][0], p[2 * kk][1]), pack2<S>(p[2 * kk][2], p[2 * kk][3]),
                                pack2<S>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack2<S>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < N8 / 2; ++np) {
      std::uint32_t b[4];
      ldsm_x4_t(b, a_addr<P>(T, kk * 16, np * 16, lane));
      mma16816<S, kK8>(acc[2 * np], a, b[0], b[1]);
      mma16816<S, kK8>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// A fragments of the warp's 16 rows (from row0) of a shared [rows][D] tile.
template <int K16, int P, class S>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[K16][4], const S* T, int row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) ldsm_x4(a[kk], a_addr<P>(T, row0, kk * 16, lane));
}

// Row sums and maxima over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Soft-capping in the units of the raw scores q . k (the kernels scale later): cap_raw = softcap / scale and
// inv_cap_raw = scale / softcap, so that scale * fa_cap(s) = softcap * tanh(scale * s / softcap); cap_raw = 0: none.
__device__ __forceinline__ float fa_cap(float s, float cap_raw, float inv_cap_raw) {
  return cap_raw > 0.0f ? cap_raw * tanhf(s * inv_cap_raw) : s;
}
// The derivative of the cap at a capped score sc: 1 - tanh^2 (1 without a cap).
__device__ __forceinline__ float fa_dcap(float sc, float inv_cap_raw_over) {
  const float th = sc * inv_cap_raw_over;  // sc / cap_raw
  return 1.0f - th * th;
}

// ---- forward ----
// grid (B * n_heads, ceil(max_len / 64)), kFaThreads, fwd_smem<D>() bytes of dynamic shared memory. Block
// (b * n_heads + h, query block from q0): reads q rows row0 + [q0, q_end) and k/v rows row0 + [0, q_end) with
// q_end = min(q0 + 64, len); writes out rows row0 + [q0, q_end) (head h) and lse[h * T + row0 + [q0, q_end)].
template <class S, int D, bool kK8>
__global__ void __launch_bounds__(kFaThreads) fa_forward_kernel(S* out, float* lse, const S* q, const S* k,
                                                                const S* v, const std::int32_t* cu_seqlens, int B,
                                                                int T, int max_len, int n_heads, int n_kv,
                                                                float scale_log2, int window, float cap_raw,
                                                                float inv_cap_raw, int* err) {
  constexpr int BN = Tiles<D>::kFwdN, P = pitch<D>(), K16 = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  S* Qs = reinterpret_cast<S*>(smem);  // [64][P]
  S* Ks = Qs + kRows * P;              // [2][BN][P]
  S* Vs = Ks + 2 * BN * P;             // [2][BN][P]
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (q0 >= len) return;  // no query of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // lse of position t at lse_h[t]
  const int q_end = min(q0 + kRows, len);  // valid query rows [q0, q_end)
  const int n_tiles = (q_end + BN - 1) / BN;
  // With a window, key tiles wholly before the first row's window are skipped.
  const int j0 = window > 0 ? max(0, q0 - window + 1) / BN : 0;
  const S* kg = k + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  const S* vg = v + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Qs, q + (row0 + q0) * qstride + static_cast<std::int64_t>(h) * D, qstride, q_end - q0);
  load_tile<BN, D>(Ks, kg + static_cast<std::int64_t>(j0) * BN * kstride, kstride, min(BN, len - j0 * BN));
  load_tile<BN, D>(Vs, vg + static_cast<std::int64_t>(j0) * BN * kstride, kstride, min(BN, len - j0 * BN));
  cp_commit();

  std::uint32_t qf[K16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int wrow = q0 + warp * 16;            // the warp's first query row
  const int trow = wrow + (lane >> 2);        // this lane's rows: trow and trow + 8
  for (int j = j0; j < n_tiles; ++j) {
    const int buf = (j - j0) & 1;
    if (j + 1 < n_tiles) {
      const int k1 = (j + 1) * BN;
      load_tile<BN, D>(Ks + (buf ^ 1) * BN * P, kg + k1 * kstride, kstride, min(BN, len - k1));
      load_tile<BN, D>(Vs + (buf ^ 1) * BN * P, vg + k1 * kstride, kstride, min(BN, len - k1));
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (j == j0) load_a<K16, P>(qf, Qs, warp * 16, lane);
    const S* Kt = Ks + buf * BN * P;
    const S* Vt = Vs + buf * BN * P;

    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    mma_abt<S, kK8, K16, BN / 8, P>(s, qf, Kt, lane);
    if (cap_raw > 0.0f) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = fa_cap(s[n][e], cap_raw, inv_cap_raw);
    }

    const int kbase = j * BN;
    // Masked where the tile reaches past the warp's first row (causal) or, with a window, before the window of its
    // last row (a key u is seen by row t iff t - window < u <= t).
    const bool before_window = window > 0 && kbase <= wrow + 15 - window;
    if (kbase + BN - 1 > wrow || before_window) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = kbase + n * 8 + 2 * (lane & 3) + (e & 1);
          const int row = trow + 8 * (e >> 1);
          if (col > row || (window > 0 && col <= row - window)) s[n][e] = -INFINITY;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(m[r], mx * scale_log2);
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[r] - base);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * r] = exp2f(fmaf(s[n][2 * r], scale_log2, -base));
        s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], scale_log2, -base));
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;  // this lane's columns only; summed over the quad at the end
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * r] *= alpha;
        o[d][2 * r + 1] *= alpha;
      }
    }
    mma_pb<S, kK8, BN / 16, D / 8, P>(o, s, Vt, lane);
    __syncthreads();  // the buffer is refilled in the next iteration
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lsum = quad_sum(l[r]);  // every lane of the quad takes part (before the row test)
    const int t = trow + 8 * r;
    if (t >= len) continue;  // past the sequence: the next sequence's row (or past T), not ours
    const float inv = 1.0f / lsum;
    S* orow = out + (row0 + t) * qstride + static_cast<std::int64_t>(h) * D + 2 * (lane & 3);
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<std::uint32_t*>(orow + d * 8) = pack2<S>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    if ((lane & 3) == 0) lse_h[t] = (m[r] + log2f(lsum)) * kLn2;
  }
}

// ---- backward ----
// Dsum[h * T + t] = sum_d dout * out over row t, head h, for every token row t < T (every row belongs to some
// sequence; no cu_seqlens needed). One warp per (t, h), taken in memory order (warp id = t * n_heads + h, so the
// warps of a block read consecutive head rows), 4 warps per block. hd is even (64 or 128).
template <class S>
__global__ void fa_dsum_kernel(float* Dsum, const S* dout, const S* out, int T, int n_heads, int hd) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kFaWarps + (threadIdx.x >> 5);  // t * nh + h
  const int lane = threadIdx.x & 31;
  if (row >= static_cast<std::int64_t>(T) * n_heads) return;  // whole warps (warp_sum below needs all 32 lanes)
  const std::int64_t t = row / n_heads;
  const int h = static_cast<int>(row % n_heads);
  const std::int64_t off = row * hd;  // (t * n_heads + h) * hd
  float acc = 0.0f;
  for (int d = 2 * lane; d < hd; d += 64) {
    acc += to_f32(dout[off + d]) * to_f32(out[off + d]) + to_f32(dout[off + d + 1]) * to_f32(out[off + d + 1]);
  }
  acc = warp_sum(acc);
  if (lane == 0) Dsum[static_cast<std::int64_t>(h) * T + t] = acc;
}

// grid (B * n_heads, ceil(max_len / 64)), kFaThreads, dq_smem<D>() bytes. dq of the block's 64 query positions:
// reads q/dout rows row0 + [q0, q_end), their lse/D at h * T + row0 + [q0, q_end), k/v rows row0 + [0, q_end);
// writes dq rows row0 + [q0, q_end) (head h), q_end = min(q0 + 64, len).
template <class S, int D, bool kK8>
__global__ void __launch_bounds__(kFaThreads) fa_dq_kernel(S* dq, const S* dout, const S* q, const S* k, const S* v,
                                                           const float* lse, const float* Dsum,
                                                           const std::int32_t* cu_seqlens, int B, int T,
                                                           int max_len, int n_heads, int n_kv, float scale,
                                                           float scale_log2, int window, float cap_raw,
                                                           float inv_cap_raw, int* err) {
  constexpr int BN = Tiles<D>::kDqN, P = pitch<D>(), K16 = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  S* Qs = reinterpret_cast<S*>(smem);  // [64][P]
  S* Gs = Qs + kRows * P;              // dO [64][P]
  S* Ks = Gs + kRows * P;              // [2][BN][P]
  S* Vs = Ks + 2 * BN * P;             // [2][BN][P]
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (q0 >= len) return;  // no query of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  const std::int64_t qoff = (row0 + q0) * qstride + static_cast<std::int64_t>(h) * D;
  const int q_end = min(q0 + kRows, len);
  const int n_tiles = (q_end + BN - 1) / BN;
  const int j0 = window > 0 ? max(0, q0 - window + 1) / BN : 0;  // key tiles before every row's window: skipped
  const S* kg = k + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  const S* vg = v + row0 * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Qs, q + qoff, qstride, q_end - q0);
  load_tile<kRows, D>(Gs, dout + qoff, qstride, q_end - q0);
  load_tile<BN, D>(Ks, kg + static_cast<std::int64_t>(j0) * BN * kstride, kstride, min(BN, len - j0 * BN));
  load_tile<BN, D>(Vs, vg + static_cast<std::int64_t>(j0) * BN * kstride, kstride, min(BN, len - j0 * BN));
  cp_commit();

  const int wrow = q0 + warp * 16;
  const int trow = wrow + (lane >> 2);
  const float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // position t at lse_h[t], D_h[t]
  const float* D_h = Dsum + static_cast<std::int64_t>(h) * T + row0;
  float lse2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = trow + 8 * r;
    lse2[r] = t < len ? lse_h[t] * kLog2e : 0.0f;
    Dr[r] = t < len ? D_h[t] : 0.0f;
  }
  std::uint32_t qf[K16][4], gf[K16][4];
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  for (int j = j0; j < n_tiles; ++j) {
    const int buf = (j - j0) & 1;
    if (j + 1 < n_tiles) {
      const int k1 = (j + 1) * BN;
      load_tile<BN, D>(Ks + (buf ^ 1) * BN * P, kg + k1 * kstride, kstride, min(BN, len - k1));
      load_tile<BN, D>(Vs + (buf ^ 1) * BN * P, vg + k1 * kstride, kstride, min(BN, len - k1));
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (j == j0) {
      load_a<K16, P>(qf, Qs, warp * 16, lane);
      load_a<K16, P>(gf, Gs, warp * 16, lane);
    }
    const S* Kt = Ks + buf * BN * P;
    const S* Vt = Vs + buf * BN * P;
    float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
    }
    mma_abt<S, kK8, K16, BN / 8, P>(s, qf, Kt, lane);
    mma_abt<S, kK8, K16, BN / 8, P>(dp, gf, Vt, lane);
    const int kbase = j * BN;
    const bool masked = kbase + BN - 1 > wrow || (window > 0 && kbase <= wrow + 15 - window);
    const float inv_cap = cap_raw > 0.0f ? 1.0f / cap_raw : 0.0f;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int col = kbase + n * 8 + 2 * (lane & 3) + (e & 1);
        const int row = trow + 8 * r;
        const float sc = fa_cap(s[n][e], cap_raw, inv_cap_raw);
        float p = exp2f(fmaf(sc, scale_log2, -lse2[r]));
        if (masked && (col > row || (window > 0 && col <= row - window))) p = 0.0f;
        s[n][e] = p * (dp[n][e] - Dr[r]);  // dS (without the scale)
        if (cap_raw > 0.0f) s[n][e] *= fa_dcap(sc, inv_cap);
      }
    mma_pb<S, kK8, BN / 16, D / 8, P>(acc, s, Kt, lane);
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = trow + 8 * r;
    if (t >= len) continue;  // past the sequence: not ours
    S* row = dq + (row0 + t) * qstride + static_cast<std::int64_t>(h) * D + 2 * (lane & 3);
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<std::uint32_t*>(row + d * 8) = pack2<S>(acc[d][2 * r] * scale, acc[d][2 * r + 1] * scale);
  }
}

// grid (B * n_heads, ceil(max_len / 64)), kFaThreads, dkv_smem<D>() bytes. dk/dv of the block's 64 key positions
// from query head h: into dk/dv (storage) when part_k is null (n_heads == n_kv), else into the fp32 partials
// part_k/part_v [T, n_heads, D]. Reads k/v rows row0 + [k0, min(k0 + 64, len)), q/dout rows row0 + [i_begin * BM,
// len) and their lse/D at h * T + row0 + the same; writes rows row0 + [k0, min(k0 + 64, len)) of dk/dv (kv head)
// or of the partials (head h).
template <class S, int D, bool kK8>
__global__ void __launch_bounds__(kFaThreads) fa_dkv_kernel(S* dk, S* dv, float* part_k, float* part_v,
                                                            const S* dout, const S* q, const S* k, const S* v,
                                                            const float* lse, const float* Dsum,
                                                            const std::int32_t* cu_seqlens, int B, int T,
                                                            int max_len, int n_heads, int n_kv, float scale,
                                                            float scale_log2, int window, float cap_raw,
                                                            float inv_cap_raw, int* err) {
  constexpr int BM = Tiles<D>::kDkvM, P = pitch<D>(), K16 = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  S* Ks = reinterpret_cast<S*>(smem);  // [64][P]
  S* Vs = Ks + kRows * P;              // [64][P]
  S* Qs = Vs + kRows * P;              // [2][BM][P]
  S* Gs = Qs + 2 * BM * P;             // dO [2][BM][P]
  float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * P);  // lse * log2 e [2][BM]
  float* Ds = Ls + 2 * BM;                                // D [2][BM]
  const int b = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int k0 = blockIdx.y * kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * D, kstride = static_cast<std::int64_t>(n_kv) * D;
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (k0 >= len) return;  // no key of this sequence here (uniform over the block, before any barrier)
  const std::int64_t row0 = sr.row0;
  const int krow = k0 + warp * 16 + (lane >> 2);  // this lane's key positions: krow and krow + 8
  // Query tiles that see some key of the block: from the diagonal to the sequence's end, or with a window to the
  // last key's window end.
  const int t_end = window > 0 ? min(len, min(k0 + kRows, len) - 1 + window) : len;
  const int i_begin = k0 / BM, i_end = (t_end + BM - 1) / BM;
  const S* qg = q + row0 * qstride + static_cast<std::int64_t>(h) * D;
  const S* gg = dout + row0 * qstride + static_cast<std::int64_t>(h) * D;
  const float* lse_h = lse + static_cast<std::int64_t>(h) * T + row0;  // position t at lse_h[t], D_h[t]
  const float* D_h = Dsum + static_cast<std::int64_t>(h) * T + row0;
  const std::int64_t koff = (row0 + k0) * kstride + static_cast<std::int64_t>(kvh) * D;
  load_tile<kRows, D>(Ks, k + koff, kstride, min(kRows, len - k0));
  load_tile<kRows, D>(Vs, v + koff, kstride, min(kRows, len - k0));
  auto load_q_tile = [&](int i, int st) {
    const int t0 = i * BM;
    load_tile<BM, D>(Qs + st * BM * P, qg + t0 * qstride, qstride, min(BM, len - t0));
    load_tile<BM, D>(Gs + st * BM * P, gg + t0 * qstride, qstride, min(BM, len - t0));
    for (int r = threadIdx.x; r < BM; r += kFaThreads) {
      const int t = t0 + r;
      Ls[st * BM + r] = t < len ? lse_h[t] * kLog2e : 0.0f;
      Ds[st * BM + r] = t < len ? D_h[t] : 0.0f;
    }
  };
  load_q_tile(i_begin, 0);
  cp_commit();

  float ak[D / 8][4], av[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    ak[i][0] = ak[i][1] = ak[i][2] = ak[i][3] = 0.0f;
    av[i][0] = av[i][1] = av[i][2] = av[i][3] = 0.0f;
  }
  for (int i = i_begin; i < i_end; ++i) {
    const int st = (i - i_begin) & 1;
    if (i + 1 < i_end) {
      load_q_tile(i + 1, st ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const S* Qt = Qs + st * BM * P;
    const S* Gt = Gs + st * BM * P;
    const float* Lt = Ls + st * BM;
    const float* Dt = Ds + st * BM;
    float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
    for (int n = 0; n < BM / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
    }
    {
      std::uint32_t kf[K16][4];
      load_a<K16, P>(kf, Ks, warp * 16, lane);
      mma_abt<S, kK8, K16, BM / 8, P>(s, kf, Qt, lane);  // S^T = K Q^T
    }
    {
      std::uint32_t vf[K16][4];
      load_a<K16, P>(vf, Vs, warp * 16, lane);
      mma_abt<S, kK8, K16, BM / 8, P>(dp, vf, Gt, lane);  // dP^T = V dO^T
    }
    const int t0 = i * BM;
    // Queries t < u (causal) or t >= len (another sequence's rows, zero-filled in shared memory) are out of every
    // sum.
    // With a window, also queries t >= u + window.
    const bool masked = t0 < k0 + warp * 16 + 15 || t0 + BM > len ||
                        (window > 0 && t0 + BM - 1 >= k0 + warp * 16 + window);
    const float inv_cap = cap_raw > 0.0f ? 1.0f / cap_raw : 0.0f;
#pragma unroll
    for (int n = 0; n < BM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ti = n * 8 + 2 * (lane & 3) + (e & 1);  // query within the tile
        const float sc = fa_cap(s[n][e], cap_raw, inv_cap_raw);
        float p = exp2f(fmaf(sc, scale_log2, -Lt[ti]));
        if (masked) {
          const int t = t0 + ti, u = krow + 8 * (e >> 1);
          if (t < u || t >= len || (window > 0 && t >= u + window)) p = 0.0f;
        }
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Dt[ti]);  // dS^T (without the scale)
        if (cap_raw > 0.0f) dp[n][e] *= fa_dcap(sc, inv_cap);
      }
    mma_pb<S, kK8, BM / 16, D / 8, P>(av, s, Gt, lane);   // dV += P^T dO
    mma_pb<S, kK8, BM / 16, D / 8, P>(ak, dp, Qt, lane);  // dK += dS^T Q
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int u = krow + 8 * r;
    if (u >= len) continue;  // past the sequence: not ours
    if (part_k == nullptr) {
      const std::int64_t off = (row0 + u) * kstride + static_cast<std::int64_t>(kvh) * D + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        *reinterpret_cast<std::uint32_t*>(dk + off + d * 8) = pack2<S>(ak[d][2 * r] * scale, ak[d][2 * r + 1] * scale);
        *reinterpret_cast<std::uint32_t*>(dv + off + d * 8) = pack2<S>(av[d][2 * r], av[d][2 * r + 1]);
      }
    } else {
      const std::int64_t off = (row0 + u) * qstride + static_cast<std::int64_t>(h) * D + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        *reinterpret_cast<float2*>(part_k + off + d * 8) = make_float2(ak[d][2 * r] * scale, ak[d][2 * r + 1] * scale);
        *reinterpret_cast<float2*>(part_v + off + d * 8) = make_float2(av[d][2 * r], av[d][2 * r + 1]);
      }
    }
  }
}

// dk/dv [T, n_kv, D] = sums over each group's heads (in head order) of the partials [T, n_heads, D] (n4 = T * n_kv *
// D / 4; every partial row is written by fa_dkv_kernel when cu_seqlens tile [0, T)). Grid-stride over groups of 4
// elements. When a kernel has flagged malformed cu_seqlens (kErrLength in *err: the rows of a rejected sequence have
// no partials), dk and dv are written as zeros without reading the partials: the call fails at the next
// synchronisation, and no uninitialised scratch is read (compute-sanitizer's initcheck found those reads).
template <class S>
__global__ void fa_reduce_kv_kernel(S* dk, S* dv, const float* part_k, const float* part_v, std::int64_t n4,
                                    int n_kv, int group, int D, const int* err) {
  const int per_row = n_kv * D / 4;
  if (*err & kErrLength) {
    for (std::int64_t i = gs_begin(); i < n4; i += gs_stride()) {
      const std::int64_t o = i * 4;
      *reinterpret_cast<uint2*>(dk + o) = make_uint2(pack2<S>(0.0f, 0.0f), pack2<S>(0.0f, 0.0f));
      *reinterpret_cast<uint2*>(dv + o) = make_uint2(pack2<S>(0.0f, 0.0f), pack2<S>(0.0f, 0.0f));
    }
    return;
  }
  for (std::int64_t i = gs_begin(); i < n4; i += gs_stride()) {
    const std::int64_t row = i / per_row;
    const int rest = static_cast<int>(i % per_row) * 4;  // kvh * D + d
    const int kvh = rest / D, d = rest % D;
    const float* pk = part_k + (row * n_kv * group + static_cast<std::int64_t>(kvh) * group) * D + d;
    const float* pv = part_v + (row * n_kv * group + static_cast<std::int64_t>(kvh) * group) * D + d;
    float4 sk = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sv = sk;
    for (int g = 0; g < group; ++g) {
      const float4 a = *reinterpret_cast<const float4*>(pk + static_cast<std::int64_t>(g) * D);
      const float4 c = *reinterpret_cast<const float4*>(pv + static_cast<std::int64_t>(g) * D);
      sk.x += a.x, sk.y += a.y, sk.z += a.z, sk.w += a.w;
      sv.x += c.x, sv.y += c.y, sv.z += c.z, sv.w += c.w;
    }
    const std::int64_t o = row * n_kv * D + rest;
    *reinterpret_cast<uint2*>(dk + o) = make_uint2(pack2<S>(sk.x, sk.y), pack2<S>(sk.z, sk.w));
    *reinterpret_cast<uint2*>(dv + o) = make_uint2(pack2<S>(sv.x, sv.y), pack2<S>(sv.z, sv.w));
  }
}

// ---- host side ----

bool force_k8() { return attention_selector() == "mma_k8"; }

// Calls f(std::integral_constant<int, D>, std::bool_constant<K8>) for the call's head_dim and mma form.
// bf16 always takes m16n8k16 (bf16 needs sm_80+); fp16 takes m16n8k8 pairs on sm_75 or when forced.
template <class S, class F>
void with_config(int head_dim, F&& f) {
  const bool k8 = std::is_same_v<S, __half> && (device_facts().major < 8 || force_k8());
  auto by_dim = [&](auto kk8) {
    if (head_dim == 64)
      f(std::integral_constant<int, 64>{}, kk8);
    else
      f(std::integral_constant<int, 128>{}, kk8);
  };
  if constexpr (std::is_same_v<S, __half>) {
    if (k8) {
      by_dim(std::true_type{});
      return;
    }
  }
  (void)k8;
  by_dim(std::false_type{});
}

}  // namespace

bool flash_attention_applies(DType st, int head_dim, std::initializer_list<const void*> tensors) {
  if (head_dim != 64 && head_dim != 128) return false;
  if (attention_selector() == "naive") return false;
  for (const void* p : tensors)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  const DeviceFacts& d = device_facts();
  const int cc = d.major * 10 + d.minor, smem = d.smem_optin;
  if (cc < 75 || (st == DType::BF16 && cc < 80)) return false;
  // The architecture these kernels were compiled for in the image the device runs: a build for compute_70 alone
  // (PTX that a newer GPU's driver JIT-compiles) has neither ldmatrix nor mma.sync in them (they would trap).
  static const int ptx = [] {
    cudaFuncAttributes code{};
    CUDA_CHECK(cudaFuncGetAttributes(&code, fa_dsum_kernel<__half>));  // every kernel of this file is compiled alike
    return code.ptxVersion;
  }();
  if (ptx < 75 || (st == DType::BF16 && ptx < 80)) return false;
  const int need = head_dim == 64 ? std::max({fwd_smem<64>(), dq_smem<64>(), dkv_smem<64>()})
                                  : std::max({fwd_smem<128>(), dq_smem<128>(), dkv_smem<128>()});
  return smem >= need;
}

void flash_attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                             int head_dim, const AttentionOptions& opt) {
  if (T == 0) return;  // (then grid.y could be 0)
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / sqrtf(static_cast<float>(head_dim));
  const float scale_log2 = kLog2e * scale;
  const float cap_raw = opt.softcap > 0.0f ? opt.softcap / scale : 0.0f;
  const float inv_cap_raw = opt.softcap > 0.0f ? scale / opt.softcap : 0.0f;
  const dim3 grid(static_cast<unsigned>(B * n_heads), static_cast<unsigned>((max_len + kRows - 1) / kRows));
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    with_config<S>(head_dim, [&](auto dim, auto k8) {
      constexpr int D = decltype(dim)::value;
      constexpr bool K8 = decltype(k8)::value;
      auto kern = fa_forward_kernel<S, D, K8>;
      allow_smem(kern, fwd_smem<D>());
      kern<<<grid, kFaThreads, fwd_smem<D>(), c.stream>>>(static_cast<S*>(out), lse, static_cast<const S*>(q),
                                                           static_cast<const S*>(k), static_cast<const S*>(v),
                                                           cu_seqlens, B, T, max_len, n_heads, n_kv, scale_log2,
                                                           opt.window, cap_raw, inv_cap_raw, c.err);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void flash_attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out,
                              const void* q, const void* k, const void* v, const float* lse,
                              const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                              int head_dim, const AttentionOptions& opt) {
  if (T == 0) return;  // (then grid.y could be 0)
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / sqrtf(static_cast<float>(head_dim));
  const float scale_log2 = kLog2e * scale;
  const float cap_raw = opt.softcap > 0.0f ? opt.softcap / scale : 0.0f;
  const float inv_cap_raw = opt.softcap > 0.0f ? scale / opt.softcap : 0.0f;
  const std::int64_t rows = static_cast<std::int64_t>(T) * n_heads;  // (token row, head) pairs: D's size
  const int group = n_heads / n_kv;
  const dim3 grid(static_cast<unsigned>(B * n_heads), static_cast<unsigned>((max_len + kRows - 1) / kRows));
  float* Dsum = static_cast<float*>(scratch_alloc(sizeof(float) * static_cast<std::size_t>(rows), c.stream));
  float* part = nullptr;
  const std::size_t part_n = static_cast<std::size_t>(T) * n_heads * head_dim;  // [T, n_heads, head_dim]
  if (group > 1) part = static_cast<float*>(scratch_alloc(2 * sizeof(float) * part_n, c.stream));
  flash_attention_dsum(c, Dsum, dout, out, T, n_heads, head_dim);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    with_config<S>(head_dim, [&](auto dim, auto k8) {
      constexpr int D = decltype(dim)::value;
      constexpr bool K8 = decltype(k8)::value;
      auto kq = fa_dq_kernel<S, D, K8>;
      allow_smem(kq, dq_smem<D>());
      kq<<<grid, kFaThreads, dq_smem<D>(), c.stream>>>(
          static_cast<S*>(dq), static_cast<const S*>(dout), static_cast<const S*>(q), static_cast<const S*>(k),
          static_cast<const S*>(v), lse, Dsum, cu_seqlens, B, T, max_len, n_heads, n_kv, scale, scale_log2,
          opt.window, cap_raw, inv_cap_raw, c.err);
      CUDA_CHECK_LAUNCH();
      auto kkv = fa_dkv_kernel<S, D, K8>;
      allow_smem(kkv, dkv_smem<D>());
      kkv<<<grid, kFaThreads, dkv_smem<D>(), c.stream>>>(
          static_cast<S*>(dk), static_cast<S*>(dv), part, part ? part + part_n : nullptr,
          static_cast<const S*>(dout), static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v),
          lse, Dsum, cu_seqlens, B, T, max_len, n_heads, n_kv, scale, scale_log2, opt.window, cap_raw, inv_cap_raw,
          c.err);
      CUDA_CHECK_LAUNCH();
    });
  });
  if (part) {
    flash_attention_reduce_kv(c, dk, dv, part, part + part_n, T, n_kv, group, head_dim);
    scratch_free(part, c.stream);
  }
  scratch_free(Dsum, c.stream);
}

void flash_attention_dsum(const Ctx& c, float* Dsum, const void* dout, const void* out, int T, int n_heads,
                          int head_dim) {
  const std::int64_t rows = static_cast<std::int64_t>(T) * n_heads;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    fa_dsum_kernel<S><<<static_cast<unsigned>((rows + kFaWarps - 1) / kFaWarps), kFaThreads, 0, c.stream>>>(
        Dsum, static_cast<const S*>(dout), static_cast<const S*>(out), T, n_heads, head_dim);
    CUDA_CHECK_LAUNCH();
  });
}

void flash_attention_reduce_kv(const Ctx& c, void* dk, void* dv, const float* part_k, const float* part_v, int T,
                               int n_kv, int group, int head_dim) {
  const std::int64_t n4 = static_cast<std::int64_t>(T) * n_kv * head_dim / 4;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    fa_reduce_kv_kernel<S><<<grid_for(n4), kThreads, 0, c.stream>>>(static_cast<S*>(dk), static_cast<S*>(dv),
                                                                     part_k, part_v, n4, n_kv, group, head_dim,
                                                                     c.err);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
