// kv_cache.cuh: the KV cache of inference on the GPU: storing k/v rows, cached attention, row gathering.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// Error code of these ops in *Ctx::err: a slot, position or table entry outside the cache, or a negative row index.
// The row concerned is skipped (kv_store), or written as zeros (attention_cached, gather_rows).
inline constexpr int kErrCacheIndex = 8;

// Semantics of kernels/cpu/kv_cache.h. Pools [n_blocks, block_size, n_kv, head_dim] (pages.table on the device),
// k, v [T, n_kv, head_dim],
// q, out [T, n_heads, head_dim], src/dst rows of `width` elements: all in storage dtype. slot, pos, idx: int32 on
// the device. attention_cached takes head_dim <= kMaxHeadDim (attention.cuh).
void kv_store(const Ctx& c, void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
              const std::int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim);
// opt: score scale, sliding window (only the blocks of positions in the window are read or checked), soft-capping.
void attention_cached(const Ctx& c, void* out, const void* q, const void* cache_k, const void* cache_v,
                      const std::int32_t* slot, const std::int32_t* pos, int T, const KvPages& pages, int n_heads,
                      int n_kv, int head_dim, const AttentionOptions& opt = {});
// rope_forward(q), rope_forward(k), kv_store(k, v) (Ops::rope_kv_store) in one kernel with their bits; inv_freq f32
// [head_dim / 2] on the device.
void rope_kv_store(const Ctx& c, void* q, void* k, const void* v, void* cache_k, void* cache_v,
                   const std::int32_t* slot, const std::int32_t* pos, const float* inv_freq, int T,
                   const KvPages& pages, int n_heads, int n_kv, int head_dim);
void gather_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width);
void scatter_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width);

}  // namespace mgrl::kernels::cuda
