// kv_cache.cpp: KV cache store, cached attention and row gathering (fp32 reference).
#include "kernels/cpu/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

std::size_t kv_row(const KvPages& pages, int slot, int pos) {
  MGRL_CHECK(slot >= 0 && slot < pages.slots && pos >= 0 && pos < pages.max_len(),
             "KV cache: slot or position outside the cache");
  const int block = pages.table[static_cast<std::size_t>(slot) * pages.max_blocks + pos / pages.block_size];
  MGRL_CHECK(block >= 0 && block < pages.n_blocks, "KV cache: a position with no block of the pool");
  return static_cast<std::size_t>(block) * pages.block_size + static_cast<std::size_t>(pos % pages.block_size);
}

void kv_store(float* cache_k, float* cache_v, const float* k, const float* v, const int32_t* slot,
              const int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim) {
  const std::size_t row = static_cast<std::size_t>(n_kv) * head_dim;
  for (int t = 0; t < T; ++t) {
    const std::size_t at = kv_row(pages, slot[t], pos[t]) * row;
    std::memcpy(cache_k + at, k + t * row, row * sizeof(float));
    std::memcpy(cache_v + at, v + t * row, row * sizeof(float));
  }
}

void attention_cached(float* out, const float* q, const float* cache_k, const float* cache_v, const int32_t* slot,
                      const int32_t* pos, int T, const KvPages& pages, int n_heads, int n_kv, int head_dim,
                      const AttentionOptions& opt) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0, "attention_cached: n_heads must be a multiple of n_kv");
  const int group = n_heads / n_kv;
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t kv_width = static_cast<std::size_t>(n_kv) * head_dim;
  std::vector<float> p(static_cast<std::size_t>(std::max(pages.max_len(), 1)));
  std::vector<std::size_t> at(p.size());  // element offset of each key row of the sequence
  std::vector<double> acc(static_cast<std::size_t>(head_dim));
  for (int t = 0; t < T; ++t) {
    MGRL_CHECK(pos[t] >= 0 && pos[t] < pages.max_len(), "KV cache: slot or position outside the cache");
    const int u0 = attention_first_key(opt, pos[t]);
    for (int u = u0; u <= pos[t]; ++u) at[static_cast<std::size_t>(u)] = kv_row(pages, slot[t], u) * kv_width;
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + (static_cast<std::size_t>(t) * n_heads + h) * head_dim;
      const std::size_t g = static_cast<std::size_t>(h / group) * head_dim;
      float m = -INFINITY;
      for (int u = u0; u <= pos[t]; ++u) {
        const float* kr = cache_k + at[static_cast<std::size_t>(u)] + g;
        double s = 0;
        for (int d = 0; d < head_dim; ++d) s += static_cast<double>(qh[d]) * kr[d];
        p[u] = static_cast<float>(s) * scale;
        if (opt.softcap > 0.0f) p[u] = opt.softcap * std::tanh(p[u] / opt.softcap);
        m = std::max(m, p[u]);
      }
      double sum = 0;
      for (int u = u0; u <= pos[t]; ++u) {
        p[u] = std::exp(p[u] - m);
        sum += p[u];
      }
      // Each output element sums its products over the keys in key order (the loops run key-major so that a value
      // row is read once, contiguously: the same sums, the same bits).
      float* o = out + (static_cast<std::size_t>(t) * n_heads + h) * head_dim;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int u = u0; u <= pos[t]; ++u) {
        const double pu = p[u];
        const float* vr = cache_v + at[static_cast<std::size_t>(u)] + g;
        for (int d = 0; d < head_dim; ++d) acc[static_cast<std::size_t>(d)] += pu * vr[d];
      }
      for (int d = 0; d < head_dim; ++d) o[d] = static_cast<float>(acc[static_cast<std::size_t>(d)] / sum);
    }
  }
}

void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int width) {
  for (int i = 0; i < n; ++i) {
    MGRL_CHECK(idx[i] >= 0, "gather_rows: negative row index");
    std::memcpy(dst + static_cast<std::size_t>(i) * width, src + static_cast<std::size_t>(idx[i]) * width,
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

void scatter_rows(float* dst, const float* src, const int32_t* idx, int n, int width) {
  for (int i = 0; i < n; ++i) {
    MGRL_CHECK(idx[i] >= 0, "scatter_rows: negative row index");
    std::memcpy(dst + static_cast<std::size_t>(idx[i]) * width, src + static_cast<std::size_t>(i) * width,
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

}  // namespace mgrl::kernels::cpu
