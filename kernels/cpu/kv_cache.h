// kv_cache.h: the KV cache of inference: storing keys/values of new tokens and attention of packed
// query rows over their sequence's cached keys (prefill and decode alike).
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// Caches are [slots, max_len, n_kv, head_dim]; row t of k, v ([T, n_kv, head_dim]) goes to
// cache[slot[t], pos[t]].
void kv_store(float* cache_k, float* cache_v, const float* k, const float* v, const int32_t* slot,
              const int32_t* pos, int T, int max_len, int n_kv, int head_dim);

// out[t, h] = softmax_u(q[t, h] . cache_k[slot[t], u, g] / sqrt(hd)) @ cache_v[slot[t], u, g] over
// u = 0..pos[t], g = h / (n_heads / n_kv). q, out: [T, n_heads, head_dim].
void attention_cached(float* out, const float* q, const float* cache_k, const float* cache_v, const int32_t* slot,
                      const int32_t* pos, int T, int max_len, int n_heads, int n_kv, int head_dim);

// dst[i, :] = src[idx[i], :], rows of `width` floats.
void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int width);

}  // namespace mgrl::kernels::cpu
