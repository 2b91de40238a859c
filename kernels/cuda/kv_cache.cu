// kv_cache.cu: KV cache store, cached attention (prefill and decode alike) and row gathering on the GPU.
//
// The cache is paged (kernels/ops.h KvPages): position p of sequence s is row p % block_size of pool block
// table[s * max_blocks + p / block_size].
//   kv_store          grid-stride over T * n_kv * head_dim elements: a plain copy of each k/v element to the pool
//                     row of (slot[t], pos[t]).
//   attention_cached  split over the KV length (flash decoding) and grouped by KV head: one block per (query row t,
//                     KV head, split of the keys 0..pos[t]), kSplitWarps warps. Each warp walks every
//                     kSplitWarps-th key of the split, loads its k and v rows once into registers and updates an
//                     online softmax (running max, sum, weighted v) for all the query heads of the group (GQA:
//                     one pass over K/V per KV head, not one per query head); the warps' states are merged in
//                     shared memory. With one split the block writes the output; otherwise it writes its partial
//                     state (unnormalised sum of v, max, sum of exp) and attention_combine merges the splits of a
//                     row. The split count fills the GPU: about 2 blocks per SM when rows x KV heads are few
//                     (decoding at small batch), one split when they are many (prefill), splits of >= 64 keys.
//                     Groups or head sizes beyond the register tiles (head_dim <= 64 with groups <= 16, <= 128
//                     with <= 8, <= 256 with <= 4), or calls of more than 65535 rows, take attention_cached_kernel:
//                     one block per (row, query head), two passes over the keys.
//   rope_kv_store     grid-stride over the rotation pairs of q, then those of k, then the elements of v: q and k
//                     rotated in place (rope_rotate_pair, the arithmetic of rope.cu), the rotated k pair and the v
//                     element copied to the pool row as kv_store_kernel does: the bits of rope, rope, kv_store.
//   gather_rows, scatter_rows  grid-stride over n * width elements.
#include <string>

#include "kernels/cuda/attend_row.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/rope.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kCacheWarps = 4;
constexpr int kCacheThreads = 32 * kCacheWarps;

// Storage element type of a copy: only the bits move, so one 2-byte type serves bf16 and fp16.
using Bits16 = std::uint16_t;

// The pool row of (slot s, position p), or -1 when s, p or the table entry is outside the cache.
__device__ __forceinline__ std::int64_t pool_row(const KvPages& pg, int s, int p) {
  if (s < 0 || s >= pg.slots || p < 0 || p >= pg.max_blocks * pg.block_size) return -1;
  const int b = pg.table[static_cast<std::int64_t>(s) * pg.max_blocks + p / pg.block_size];
  if (b < 0 || b >= pg.n_blocks) return -1;
  return static_cast<std::int64_t>(b) * pg.block_size + p % pg.block_size;
}

// grid-stride over i < T * row (row = n_kv * head_dim): element i of k/v (row t = i / row) goes to the pool row of
// (slot[t], pos[t]). Rows with a bad slot, position or block are skipped and flagged.
__global__ void kv_store_kernel(Bits16* ck, Bits16* cv, const Bits16* k, const Bits16* v, const std::int32_t* slot,
                                const std::int32_t* pos, int T, KvPages pg, std::int64_t row, int* err) {
  const std::int64_t n = static_cast<std::int64_t>(T) * row;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / row, col = i % row;
    const std::int64_t r = pool_row(pg, slot[t], pos[t]);
    if (r < 0) {
      if (col == 0) atomicOr(err, kErrCacheIndex);
      continue;
    }
    const std::int64_t at = r * row + col;
    ck[at] = k[i];
    cv[at] = v[i];
  }
}

// grid-stride over i < n * width: dst[idx[r], col] = src[r, col]; a negative index is skipped (flagged).
__global__ void scatter_rows_kernel(Bits16* dst, const Bits16* src, const std::int32_t* idx, int n, int width,
                                    int* err) {
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = gs_begin(); i < total; i += gs_stride()) {
    const std::int64_t r = i / width, col = i % width;
    const int to = idx[r];
    if (to < 0) {
      if (col == 0) atomicOr(err, kErrCacheIndex);
      continue;
    }
    dst[static_cast<std::int64_t>(to) * width + col] = src[i];
  }
}

// grid-stride over i < nq + nk + nv: i < nq, pair (t, h, j) of q (nq = T * n_heads * half); then pair (t, h, j) of k
// (nk = T * n_kv * half), rotated and stored; then element (t, col) of v (nv = T * row), stored. A row with a bad
// slot, position or block is rotated but not stored (flagged), as kv_store after rope_forward does.
template <class S>
__global__ void rope_kv_store_kernel(S* q, S* k, const S* v, S* ck, S* cv, const std::int32_t* slot,
                                     const std::int32_t* pos, const float* inv_freq, int T, int n_heads, int n_kv,
                                     int hd, KvPages pg, int* err) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int half = hd / 2;
  const std::int64_t row = static_cast<std::int64_t>(n_kv) * hd;
  const std::int64_t nq = static_cast<std::int64_t>(T) * n_heads * half;
  const std::int64_t nk = static_cast<std::int64_t>(T) * n_kv * half;
  const std::int64_t n = nq + nk + T * row;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    if (i < nq) {
      const std::int64_t th = i / half;  // t * n_heads + h
      rope_rotate_pair(q + th * hd, static_cast<int>(i % half), half, pos[th / n_heads], inv_freq, 1.0f);
    } else if (i < nq + nk) {
      const std::int64_t e = i - nq, th = e / half;  // th = t * n_kv + h
      const int j = static_cast<int>(e % half);
      const std::int64_t t = th / n_kv;
      S* kr = k + th * hd;
      rope_rotate_pair(kr, j, half, pos[t], inv_freq, 1.0f);
      const std::int64_t r = pool_row(pg, slot[t], pos[t]);
      if (r < 0) continue;  // flagged by the row's v element 0 below
      const std::int64_t at = r * row + (th % n_kv) * hd;
      ck[at + j] = kr[j];
      ck[at + j + half] = kr[j + half];
    } else {
      const std::int64_t e = i - nq - nk, t = e / row, col = e % row;
      const std::int64_t r = pool_row(pg, slot[t], pos[t]);
      if (r < 0) {
        if (col == 0) atomicOr(err, kErrCacheIndex);
        continue;
      }
      cv[r * row + col] = v[e];
    }
  }
}

// grid-stride over i < n * width: dst[r, col] = src[idx[r], col]; a negative index gives a zero row (flagged).
__global__ void gather_rows_kernel(Bits16* dst, const Bits16* src, const std::int32_t* idx, int n, int width,
                                   int* err) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  for (std::int64_t i = gs_begin(); i < total; i += gs_stride()) {
    const std::int64_t r = i / width, col = i % width;
    const int from = idx[r];
    if (from < 0) {
      if (col == 0) atomicOr(err, kErrCacheIndex);
      dst[i] = 0;  // the bits of +0 in bf16 and fp16
      continue;
    }
    dst[i] = src[static_cast<std::int64_t>(from) * width + col];
  }
}


// grid.x = T * n_heads (block id = t * n_heads + h, which is also the row of q and out in units of head_dim),
// kCacheThreads. out[t, h] = softmax_u(cap(scale * q[t, h] . k_u)) @ v_u over u = first..pos[t] of slot[t]'s cache
// (first = pos[t] - window + 1 with a window, else 0).
template <class S>
__global__ void attention_cached_kernel(S* out, const S* q, const S* ck, const S* cv, const std::int32_t* slot,
                                        const std::int32_t* pos, KvPages pg, int n_heads, int n_kv, int hd,
                                        float scale, int window, float softcap, int* err) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float acc[kCacheWarps][kMaxHeadDim];
  __shared__ float red[kCacheWarps];
  const std::int64_t bid = blockIdx.x;
  const int h = static_cast<int>(bid % n_heads);
  const std::int64_t t = bid / n_heads;
  const int kvh = h / (n_heads / n_kv);
  const std::int64_t width = static_cast<std::int64_t>(n_kv) * hd;  // elements per cached position
  S* o = out + bid * hd;
  const int s = slot[t], last = pos[t];
  const int first = window > 0 ? max(0, last - window + 1) : 0;
  // Every block of positions first..last must be in the pool (uniform over the block after the barrier).
  bool bad = s < 0 || s >= pg.slots || last < 0 || last >= pg.max_blocks * pg.block_size;
  const std::int32_t* table = pg.table + static_cast<std::int64_t>(bad ? 0 : s) * pg.max_blocks;
  if (!bad)
    for (int j = first / pg.block_size + static_cast<int>(threadIdx.x); j <= last / pg.block_size; j += blockDim.x)
      bad = bad || table[j] < 0 || table[j] >= pg.n_blocks;
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) atomicOr(err, kErrCacheIndex);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = from_f32<S>(0.0f);
    return;
  }
  const S* qi = q + bid * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = to_f32(qi[d]);
  __syncthreads();
  const std::int64_t head = static_cast<std::int64_t>(kvh) * hd;
  attend_row<S, kCacheWarps>(o, qs, acc, red, ck + head, cv + head, PagedRows{table, pg.block_size, width}, first,
                             last, hd, scale, softcap);
}

// Flash decoding. Per lane, head dims d = lane + 32 i (i < kD) of kG query heads: q, the running max and sum and
// the weighted v sum in registers (kG x kD <= 32 floats each for q and acc).
constexpr int kSplitWarps = 4;
constexpr int kSplitThreads = 32 * kSplitWarps;
constexpr int kMinSplitKeys = 64;

// grid (n_splits, n_kv, T), kSplitThreads. Keys lo..hi-1 of row t's sequence with lo = max(split * chunk, first),
// hi = min(pos[t] + 1, split * chunk + chunk), first = pos[t] - window + 1 with a window (else 0): a split wholly
// before the window is empty; query heads kvh * group .. + group - 1. softcap > 0 soft-caps the scores.
template <class S, int kD, int kG>
__global__ void attention_split_kernel(S* out, float* part, const S* q, const S* ck, const S* cv,
                                       const std::int32_t* slot, const std::int32_t* pos, KvPages pg, int n_heads,
                                       int n_kv, int hd, int n_splits, int chunk, float scale, int window,
                                       float softcap, int* err) {
  __shared__ float s_m[kSplitWarps][kG], s_l[kSplitWarps][kG];
  __shared__ float s_acc[kSplitWarps][kG][kD * 32];
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int split = blockIdx.x, kvh = blockIdx.y;
  const std::int64_t t = blockIdx.z;
  const int group = n_heads / n_kv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = slot[t], last = pos[t];
  const std::int64_t width = static_cast<std::int64_t>(n_kv) * hd;
  bool bad = s < 0 || s >= pg.slots || last < 0 || last >= pg.max_blocks * pg.block_size;
  const int first = window > 0 ? max(0, last - window + 1) : 0;
  const int lo = max(split * chunk, first), hi = bad ? lo : min(last + 1, split * chunk + chunk);
  const std::int32_t* table = pg.table + static_cast<std::int64_t>(bad ? 0 : s) * pg.max_blocks;
  if (!bad && lo < hi)
    for (int j = lo / pg.block_size + static_cast<int>(threadIdx.x); j <= (hi - 1) / pg.block_size; j += blockDim.x)
      bad = bad || table[j] < 0 || table[j] >= pg.n_blocks;
  if (__syncthreads_or(bad)) {  // uniform over the block
    if (threadIdx.x == 0) atomicOr(err, kErrCacheIndex);
    if (split == 0)
      for (int i = threadIdx.x; i < group * hd; i += blockDim.x)
        out[(t * n_heads + static_cast<std::int64_t>(kvh) * group) * hd + i] = from_f32<S>(0.0f);
    if (n_splits > 1 && threadIdx.x < group) {  // an empty partial: the combine ignores it
      float* ps = part + ((t * n_heads + kvh * group + threadIdx.x) * n_splits + split) * (hd + 2);
      ps[hd] = -INFINITY;
      ps[hd + 1] = 0.0f;
    }
    return;
  }
  float qr[kG][kD], acc[kG][kD], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int d = lane + 32 * i;
      acc[g][i] = 0.0f;
      qr[g][i] = (g < group && d < hd) ? to_f32(q[(t * n_heads + kvh * group + g) * hd + d]) * scale : 0.0f;
    }
  }
  const PagedRows at{table, pg.block_size, width};
  const std::int64_t head = static_cast<std::int64_t>(kvh) * hd;
  for (int u = lo + warp; u < hi; u += kSplitWarps) {
    const S* kr = ck + at(u) + head;
    const S* vr = cv + at(u) + head;
    float kreg[kD], vreg[kD];
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int d = lane + 32 * i;
      kreg[i] = d < hd ? to_f32(kr[d]) : 0.0f;
      vreg[i] = d < hd ? to_f32(vr[d]) : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g >= group) break;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kD; ++i) dot += qr[g][i] * kreg[i];
      const float sc = capped_score(warp_sum(dot), softcap);  // the scaled (capped) score, in every lane
      const float mn = fmaxf(m[g], sc);
      const float c = expf(m[g] - mn), p = expf(sc - mn);
      l[g] = l[g] * c + p;
#pragma unroll
      for (int i = 0; i < kD; ++i) acc[g][i] = acc[g][i] * c + p * vreg[i];
      m[g] = mn;
    }
  }
  // Merge the warps: every warp publishes its state; thread (g, d) pairs combine them.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kD; ++i) s_acc[warp][g][lane + 32 * i] = acc[g][i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    float M = -INFINITY;
    for (int w = 0; w < kSplitWarps; ++w) M = fmaxf(M, s_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY)
      for (int w = 0; w < kSplitWarps; ++w) {
        const float e = expf(s_m[w][g] - M);  // 0 for a warp with no key
        L += s_l[w][g] * e;
        A += s_acc[w][g][d] * e;
      }
    const std::int64_t row = t * n_heads + static_cast<std::int64_t>(kvh) * group + g;
    if (n_splits == 1) {
      out[row * hd + d] = from_f32<S>(A / L);  // L > 0: key `first` is in the only split
    } else {
      float* ps = part + (row * n_splits + split) * (hd + 2);
      ps[d] = A;
      if (d == 0) {
        ps[hd] = M;
        ps[hd + 1] = L;
      }
    }
  }
}

// grid T * n_heads, 64 threads: out[row] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the row's splits.
template <class S>
__global__ void attention_combine_kernel(S* out, const float* part, int n_splits, int hd) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const std::int64_t row = blockIdx.x;
  const float* pr = part + row * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) M = fmaxf(M, pr[sp * (hd + 2) + hd]);
  float L = 0.0f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float ms = pr[sp * (hd + 2) + hd];
    if (ms != -INFINITY) L += pr[sp * (hd + 2) + hd + 1] * expf(ms - M);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float A = 0.0f;
    for (int sp = 0; sp < n_splits; ++sp) {
      const float ms = pr[sp * (hd + 2) + hd];
      if (ms != -INFINITY) A += pr[sp * (hd + 2) + d] * expf(ms - M);
    }
    out[row * hd + d] = from_f32<S>(L > 0.0f ? A / L : 0.0f);
  }
}

// Launches the split kernel with register tiles for head_dim <= 32 kD and groups <= kG; false when they do not fit.
template <class S, int kD, int kG>
bool launch_split(const Ctx& c, S* out, const S* q, const S* ck, const S* cv, const std::int32_t* slot,
                  const std::int32_t* pos, int T, const KvPages& pg, int n_heads, int n_kv, int hd, float scale,
                  int window, float softcap) {
  const int group = n_heads / n_kv;
  if (hd > 32 * kD || group > kG || T > 65535) return false;  // grid.z holds the rows
  // Splits: enough blocks for about two per SM, none shorter than kMinSplitKeys keys.
  const std::int64_t row_blocks = static_cast<std::int64_t>(T) * n_kv;
  const int max_len = pg.max_len();
  const std::int64_t want = (2 * static_cast<std::int64_t>(sm_count()) + row_blocks - 1) / row_blocks;
  const int most = std::max(1, (max_len + kMinSplitKeys - 1) / kMinSplitKeys);
  int n_splits = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(want, most)));
  const int chunk = (max_len + n_splits - 1) / n_splits;
  n_splits = (max_len + chunk - 1) / chunk;
  float* part = nullptr;
  if (n_splits > 1)
    part = static_cast<float*>(
        scratch_alloc(static_cast<std::size_t>(T) * n_heads * n_splits * (hd + 2) * sizeof(float), c.stream));
  const dim3 grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(n_kv), static_cast<unsigned>(T));
  const bool pdl = pdl_enabled();
  launch(pdl, attention_split_kernel<S, kD, kG>, grid, kSplitThreads, 0, c.stream, out, part, q, ck, cv, slot, pos, pg,
         n_heads, n_kv, hd, n_splits, chunk, scale, window, softcap, c.err);
  if (n_splits > 1) {
    launch(pdl, attention_combine_kernel<S>, static_cast<unsigned>(static_cast<std::int64_t>(T) * n_heads), 64, 0,
           c.stream, out, part, n_splits, hd);
    scratch_free(part, c.stream);
  }
  return true;
}

}  // namespace

void kv_store(const Ctx& c, void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
              const std::int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim) {
  MGRL_CHECK(T >= 0 && pages.block_size > 0 && n_kv > 0 && head_dim > 0, "kv_store: bad sizes");
  static_assert(sizeof(__nv_bfloat16) == sizeof(Bits16) && sizeof(__half) == sizeof(Bits16));
  const std::int64_t row = static_cast<std::int64_t>(n_kv) * head_dim;
  const std::int64_t n = static_cast<std::int64_t>(T) * row;
  if (n == 0) return;
  kv_store_kernel<<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<Bits16*>(cache_k), static_cast<Bits16*>(cache_v),
                                                          static_cast<const Bits16*>(k), static_cast<const Bits16*>(v),
                                                          slot, pos, T, pages, row, c.err);
  CUDA_CHECK_LAUNCH();
}

void rope_kv_store(const Ctx& c, void* q, void* k, const void* v, void* cache_k, void* cache_v,
                   const std::int32_t* slot, const std::int32_t* pos, const float* inv_freq, int T,
                   const KvPages& pages, int n_heads, int n_kv, int head_dim) {
  MGRL_CHECK(T >= 0 && pages.block_size > 0 && n_heads > 0 && n_kv > 0 && head_dim > 0 && head_dim % 2 == 0,
             "rope_kv_store: bad sizes (head_dim " + std::to_string(head_dim) + " must be even)");
  const std::int64_t n = static_cast<std::int64_t>(T) * (n_heads + 3 * n_kv) * (head_dim / 2);  // q, k pairs; v
  if (n == 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    launch(pdl_enabled(), rope_kv_store_kernel<S>, grid_for(n), kThreads, 0, c.stream, static_cast<S*>(q),
           static_cast<S*>(k), static_cast<const S*>(v), static_cast<S*>(cache_k), static_cast<S*>(cache_v), slot, pos,
           inv_freq, T, n_heads, n_kv, head_dim, pages, c.err);
  });
}

void attention_cached(const Ctx& c, void* out, const void* q, const void* cache_k, const void* cache_v,
                      const std::int32_t* slot, const std::int32_t* pos, int T, const KvPages& pages, int n_heads,
                      int n_kv, int head_dim, const AttentionOptions& opt) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0, "attention_cached: n_heads (" + std::to_string(n_heads) +
                                                  ") must be a multiple of n_kv (" + std::to_string(n_kv) + ")");
  MGRL_CHECK(head_dim > 0 && head_dim <= kMaxHeadDim, "the CUDA attention kernels take head_dim in [1, " +
                                                          std::to_string(kMaxHeadDim) + "] (got " +
                                                          std::to_string(head_dim) + ")");
  MGRL_CHECK(T >= 0 && pages.block_size > 0, "attention_cached: bad sizes");
  const std::int64_t blocks = static_cast<std::int64_t>(T) * n_heads;
  MGRL_CHECK(blocks < (std::int64_t{1} << 31), "attention_cached: grid too large");
  if (blocks == 0) return;
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / sqrtf(static_cast<float>(head_dim));
  const int w = opt.window;
  const float cap = opt.softcap;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    auto* o = static_cast<S*>(out);
    const auto *qq = static_cast<const S*>(q), *kk = static_cast<const S*>(cache_k),
               *vv = static_cast<const S*>(cache_v);
    if (launch_split<S, 2, 16>(c, o, qq, kk, vv, slot, pos, T, pages, n_heads, n_kv, head_dim, scale, w, cap) ||
        launch_split<S, 4, 8>(c, o, qq, kk, vv, slot, pos, T, pages, n_heads, n_kv, head_dim, scale, w, cap) ||
        launch_split<S, 8, 4>(c, o, qq, kk, vv, slot, pos, T, pages, n_heads, n_kv, head_dim, scale, w, cap))
      return;
    attention_cached_kernel<S><<<static_cast<unsigned>(blocks), kCacheThreads, 0, c.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(q), static_cast<const S*>(cache_k), static_cast<const S*>(cache_v),
        slot, pos, pages, n_heads, n_kv, head_dim, scale, w, cap, c.err);
    CUDA_CHECK_LAUNCH();
  });
}

void gather_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width) {
  MGRL_CHECK(n >= 0 && width >= 0, "gather_rows: bad sizes");
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  if (total == 0) return;
  launch(pdl_enabled(), gather_rows_kernel, grid_for(total), kThreads, 0, c.stream, static_cast<Bits16*>(dst),
         static_cast<const Bits16*>(src), idx, n, width, c.err);
}

void scatter_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width) {
  MGRL_CHECK(n >= 0 && width >= 0, "scatter_rows: bad sizes");
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  if (total == 0) return;
  scatter_rows_kernel<<<grid_for(total), kThreads, 0, c.stream>>>(static_cast<Bits16*>(dst),
                                                                  static_cast<const Bits16*>(src), idx, n, width, c.err);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mgrl::kernels::cuda
