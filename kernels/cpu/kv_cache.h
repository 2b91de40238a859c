// kv_cache.h: the KV cache of inference: storing keys/values of new tokens and attention of packed
// query rows over their sequence's cached keys (prefill and decode alike), through a paged block table.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/attention_options.h"
#include "kernels/ops.h"

namespace mgrl::kernels::cpu {

// The pool row (in units of n_kv * head_dim elements) holding position pos of sequence slot: checked, a
// FatalError for a slot, position or block outside the cache (or a table entry with no block).
std::size_t kv_row(const KvPages& pages, int slot, int pos);

// Pools are [n_blocks, block_size, n_kv, head_dim] (pages.table in host memory here); row t of k, v
// ([T, n_kv, head_dim]) goes to position pos[t] of sequence slot[t].
void kv_store(float* cache_k, float* cache_v, const float* k, const float* v, const int32_t* slot,
              const int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim);

// out[t, h] = softmax_u(q[t, h] . k(slot[t], u, g) / sqrt(hd)) @ v(slot[t], u, g) over u = 0..pos[t],
// g = h / (n_heads / n_kv), k(s, u, g) the key of head g at position u of sequence s. q, out: [T, n_heads, head_dim].
// opt as attention_forward's (kernels/attention_options.h): with a window, u runs over pos[t] - window < u <= pos[t]
// only (positions before it need no block).
void attention_cached(float* out, const float* q, const float* cache_k, const float* cache_v, const int32_t* slot,
                      const int32_t* pos, int T, const KvPages& pages, int n_heads, int n_kv, int head_dim,
                      const AttentionOptions& opt = {});

// dst[i, :] = src[idx[i], :], rows of `width` floats.
void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int width);
// dst[idx[i], :] = src[i, :] (distinct indices; dst's other rows untouched).
void scatter_rows(float* dst, const float* src, const int32_t* idx, int n, int width);

}  // namespace mgrl::kernels::cpu
