// attention.cpp: causal grouped-query attention over packed sequences, plain loops; forward and backward.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

namespace {

void check_shapes(const int32_t* cu, int B, int T, int max_len, int n_heads, int n_kv, int head_dim) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0,
             "n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv (" + std::to_string(n_kv) + ")");
  MGRL_CHECK(head_dim > 0, "head_dim must be positive");
  MGRL_CHECK(B >= 0 && cu[0] == 0 && cu[B] == T,
             "cu_seqlens must run from 0 to T (" + std::to_string(T) + "), got " + std::to_string(cu[0]) + " .. " +
                 std::to_string(cu[B]));
  for (int b = 0; b < B; ++b) {
    const int len = cu[b + 1] - cu[b];
    MGRL_CHECK(len >= 0 && len <= max_len, "sequence " + std::to_string(b) + " has length " + std::to_string(len) +
                                               " outside [0, max_len " + std::to_string(max_len) + "]");
  }
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

float score_scale(const AttentionOptions& opt, int head_dim) {
  return opt.scale > 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// The (soft-capped) score of a scaled dot product.
float cap(float s, const AttentionOptions& opt) { return opt.softcap > 0.0f ? opt.softcap * std::tanh(s / opt.softcap) : s; }

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv, int head_dim,
                       const AttentionOptions& opt) {
  check_shapes(cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim);
  const int group = n_heads / n_kv;
  const int64_t qs = static_cast<int64_t>(n_heads) * head_dim;  // row strides
  const int64_t ks = static_cast<int64_t>(n_kv) * head_dim;
  const float scale = score_scale(opt, head_dim);
  std::vector<float> p(static_cast<size_t>(std::max(max_len, 1)));
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = cu_seqlens[b];
    const int len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int h = 0; h < n_heads; ++h) {
      const int64_t kh = static_cast<int64_t>(h / group) * head_dim;
      float* lse_h = lse + static_cast<int64_t>(h) * T + row0;
      for (int t = 0; t < len; ++t) {
        float* o = out + (row0 + t) * qs + static_cast<int64_t>(h) * head_dim;
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(head_dim));
        const float* qi = q + (row0 + t) * qs + static_cast<int64_t>(h) * head_dim;
        float m = -INFINITY;
        const int u0 = attention_first_key(opt, t);
        for (int u = u0; u <= t; ++u) {
          p[u] = cap(scale * dot(qi, k + (row0 + u) * ks + kh, head_dim), opt);
          m = std::max(m, p[u]);
        }
        float sum = 0.0f;
        for (int u = u0; u <= t; ++u) {
          p[u] = std::exp(p[u] - m);
          sum += p[u];
        }
        const float inv = 1.0f / sum;
        for (int u = u0; u <= t; ++u) {
          const float w = p[u] * inv;
          const float* vu = v + (row0 + u) * ks + kh;
          for (int d = 0; d < head_dim; ++d) o[d] += w * vu[d];
        }
        lse_h[t] = m + std::log(sum);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, const int32_t* cu_seqlens, int B, int T, int max_len,
                        int n_heads, int n_kv, int head_dim, const AttentionOptions& opt) {
  check_shapes(cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim);
  const int group = n_heads / n_kv;
  const int64_t qs = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t ks = static_cast<int64_t>(n_kv) * head_dim;
  const float scale = score_scale(opt, head_dim);
  std::memset(dq, 0, sizeof(float) * static_cast<size_t>(T) * qs);
  std::memset(dk, 0, sizeof(float) * static_cast<size_t>(T) * ks);
  std::memset(dv, 0, sizeof(float) * static_cast<size_t>(T) * ks);
  std::vector<float> p(static_cast<size_t>(std::max(max_len, 1))), dp(static_cast<size_t>(std::max(max_len, 1)));
  std::vector<float> dcap(static_cast<size_t>(std::max(max_len, 1)), 1.0f);  // d capped / d scaled score
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = cu_seqlens[b];
    const int len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int h = 0; h < n_heads; ++h) {
      const int64_t kh = static_cast<int64_t>(h / group) * head_dim;
      const int64_t qh = static_cast<int64_t>(h) * head_dim;
      const float* lse_h = lse + static_cast<int64_t>(h) * T + row0;
      for (int t = 0; t < len; ++t) {
        const float* qi = q + (row0 + t) * qs + qh;
        const float* gi = dout + (row0 + t) * qs + qh;
        float* dqi = dq + (row0 + t) * qs + qh;
        float D = 0.0f;  // sum_u p_u dp_u  (= dout . out)
        const int u0 = attention_first_key(opt, t);
        for (int u = u0; u <= t; ++u) {
          const float s = cap(scale * dot(qi, k + (row0 + u) * ks + kh, head_dim), opt);
          if (opt.softcap > 0.0f) dcap[u] = 1.0f - (s / opt.softcap) * (s / opt.softcap);
          p[u] = std::exp(s - lse_h[t]);
          dp[u] = dot(gi, v + (row0 + u) * ks + kh, head_dim);
          D += p[u] * dp[u];
        }
        for (int u = u0; u <= t; ++u) {
          const float ds = scale * p[u] * (dp[u] - D) * dcap[u];
          const float* ku = k + (row0 + u) * ks + kh;
          float* dku = dk + (row0 + u) * ks + kh;
          float* dvu = dv + (row0 + u) * ks + kh;
          for (int d = 0; d < head_dim; ++d) {
            dqi[d] += ds * ku[d];
            dku[d] += ds * qi[d];
            dvu[d] += p[u] * gi[d];
          }
        }
      }
    }
  }
}

}  // namespace mgrl::kernels::cpu
