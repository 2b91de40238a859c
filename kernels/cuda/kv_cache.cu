// kv_cache.cu: KV cache store, cached attention (prefill and decode alike) and row gathering on the GPU.
//
// The cache is paged (kernels/ops.h KvPages): position p of sequence s is row p % block_size of pool block
// table[s * max_blocks + p / block_size].
//   kv_store          grid-stride over T * n_kv * head_dim elements: a plain copy of each k/v element to the pool
//                     row of (slot[t], pos[t]).
//   attention_cached  one block per query row and head (t, h), kCacheWarps warps, the same two passes as the
//                     training forward (attention.cu): pass 1 the max score over keys u <= pos[t], pass 2 the sum
//                     of exp(s - max) and the weighted v rows (per-warp accumulators in shared memory, summed at
//                     the end). Scores are computed twice; k/v rows of a group's heads are re-read from L2.
//   gather_rows       grid-stride over n * width elements.
#include <string>

#include "kernels/cuda/attend_row.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/kv_cache.cuh"

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

// grid-stride over i < n * width: dst[r, col] = src[idx[r], col]; a negative index gives a zero row (flagged).
__global__ void gather_rows_kernel(Bits16* dst, const Bits16* src, const std::int32_t* idx, int n, int width,
                                   int* err) {
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
// kCacheThreads. out[t, h] = softmax_u(scale * q[t, h] . k_u) @ v_u over u = 0..pos[t] of slot[t]'s cache.
template <class S>
__global__ void attention_cached_kernel(S* out, const S* q, const S* ck, const S* cv, const std::int32_t* slot,
                                        const std::int32_t* pos, KvPages pg, int n_heads, int n_kv, int hd,
                                        float scale, int* err) {
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
  // Every block of positions 0..last must be in the pool (uniform over the block after the barrier).
  bool bad = s < 0 || s >= pg.slots || last < 0 || last >= pg.max_blocks * pg.block_size;
  const std::int32_t* table = pg.table + static_cast<std::int64_t>(bad ? 0 : s) * pg.max_blocks;
  if (!bad)
    for (int j = threadIdx.x; j <= last / pg.block_size; j += blockDim.x)
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
  attend_row<S, kCacheWarps>(o, qs, acc, red, ck + head, cv + head, PagedRows{table, pg.block_size, width}, last, hd,
                             scale);
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

void attention_cached(const Ctx& c, void* out, const void* q, const void* cache_k, const void* cache_v,
                      const std::int32_t* slot, const std::int32_t* pos, int T, const KvPages& pages, int n_heads,
                      int n_kv, int head_dim) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0, "attention_cached: n_heads (" + std::to_string(n_heads) +
                                                  ") must be a multiple of n_kv (" + std::to_string(n_kv) + ")");
  MGRL_CHECK(head_dim > 0 && head_dim <= kMaxHeadDim, "the CUDA attention kernels take head_dim in [1, " +
                                                          std::to_string(kMaxHeadDim) + "] (got " +
                                                          std::to_string(head_dim) + ")");
  MGRL_CHECK(T >= 0 && pages.block_size > 0, "attention_cached: bad sizes");
  const std::int64_t blocks = static_cast<std::int64_t>(T) * n_heads;
  MGRL_CHECK(blocks < (std::int64_t{1} << 31), "attention_cached: grid too large");
  if (blocks == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    attention_cached_kernel<S><<<static_cast<unsigned>(blocks), kCacheThreads, 0, c.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(q), static_cast<const S*>(cache_k), static_cast<const S*>(cache_v),
        slot, pos, pages, n_heads, n_kv, head_dim, scale, c.err);
    CUDA_CHECK_LAUNCH();
  });
}

void gather_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width) {
  MGRL_CHECK(n >= 0 && width >= 0, "gather_rows: bad sizes");
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  if (total == 0) return;
  gather_rows_kernel<<<grid_for(total), kThreads, 0, c.stream>>>(static_cast<Bits16*>(dst),
                                                                 static_cast<const Bits16*>(src), idx, n, width, c.err);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mgrl::kernels::cuda
