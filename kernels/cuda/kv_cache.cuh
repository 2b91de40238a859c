// kv_cache.cuh: the KV cache of inference on the GPU: storing k/v rows, cached attention, row gathering.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Error code of these ops in *Ctx::err: a negative slot, a position outside [0, max_len) or a negative row index.
// The row concerned is skipped (kv_store), or written as zeros (attention_cached, gather_rows).
inline constexpr int kErrCacheIndex = 8;

// Semantics of kernels/cpu/kv_cache.h. Caches [slots, max_len, n_kv, head_dim], k, v [T, n_kv, head_dim],
// q, out [T, n_heads, head_dim], src/dst rows of `width` elements: all in storage dtype. slot, pos, idx: int32 on
// the device. attention_cached takes head_dim <= kMaxHeadDim (attention.cuh).
void kv_store(const Ctx& c, void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
              const std::int32_t* pos, int T, int max_len, int n_kv, int head_dim);
void attention_cached(const Ctx& c, void* out, const void* q, const void* cache_k, const void* cache_v,
                      const std::int32_t* slot, const std::int32_t* pos, int T, int max_len, int n_heads, int n_kv,
                      int head_dim);
void gather_rows(const Ctx& c, void* dst, const void* src, const std::int32_t* idx, int n, int width);

}  // namespace mgrl::kernels::cuda
