// attention.cpp: causal grouped-query attention (right-padded batch), plain loops; forward and backward.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

namespace {

void check_shapes(const int32_t* lengths, int B, int L, int n_heads, int n_kv, int head_dim) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0,
             "n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv (" + std::to_string(n_kv) + ")");
  MGRL_CHECK(head_dim > 0, "head_dim must be positive");
  for (int b = 0; b < B; ++b) {
    MGRL_CHECK(lengths[b] >= 0 && lengths[b] <= L,
               "sequence length " + std::to_string(lengths[b]) + " outside [0, " + std::to_string(L) + "]");
  }
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* lengths,
                       int B, int L, int n_heads, int n_kv, int head_dim) {
  check_shapes(lengths, B, L, n_heads, n_kv, head_dim);
  const int group = n_heads / n_kv;
  const int64_t qs = static_cast<int64_t>(n_heads) * head_dim;  // row strides
  const int64_t ks = static_cast<int64_t>(n_kv) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> p(static_cast<size_t>(std::max(L, 1)));
  for (int b = 0; b < B; ++b) {
    const int len = lengths[b];
    const int64_t row0 = static_cast<int64_t>(b) * L;
    for (int h = 0; h < n_heads; ++h) {
      const int64_t kh = static_cast<int64_t>(h / group) * head_dim;
      float* lse_bh = lse + (static_cast<int64_t>(b) * n_heads + h) * L;
      for (int t = 0; t < L; ++t) {
        float* o = out + (row0 + t) * qs + static_cast<int64_t>(h) * head_dim;
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(head_dim));
        if (t >= len) {
          lse_bh[t] = 0.0f;
          continue;
        }
        const float* qi = q + (row0 + t) * qs + static_cast<int64_t>(h) * head_dim;
        float m = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          p[u] = scale * dot(qi, k + (row0 + u) * ks + kh, head_dim);
          m = std::max(m, p[u]);
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) {
          p[u] = std::exp(p[u] - m);
          sum += p[u];
        }
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) {
          const float w = p[u] * inv;
          const float* vu = v + (row0 + u) * ks + kh;
          for (int d = 0; d < head_dim; ++d) o[d] += w * vu[d];
        }
        lse_bh[t] = m + std::log(sum);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, const int32_t* lengths, int B, int L, int n_heads, int n_kv,
                        int head_dim) {
  check_shapes(lengths, B, L, n_heads, n_kv, head_dim);
  const int group = n_heads / n_kv;
  const int64_t qs = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t ks = static_cast<int64_t>(n_kv) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::memset(dq, 0, sizeof(float) * static_cast<size_t>(B) * L * qs);
  std::memset(dk, 0, sizeof(float) * static_cast<size_t>(B) * L * ks);
  std::memset(dv, 0, sizeof(float) * static_cast<size_t>(B) * L * ks);
  std::vector<float> p(static_cast<size_t>(std::max(L, 1))), dp(static_cast<size_t>(std::max(L, 1)));
  for (int b = 0; b < B; ++b) {
    const int len = lengths[b];
    const int64_t row0 = static_cast<int64_t>(b) * L;
    for (int h = 0; h < n_heads; ++h) {
      const int64_t kh = static_cast<int64_t>(h / group) * head_dim;
      const int64_t qh = static_cast<int64_t>(h) * head_dim;
      const float* lse_bh = lse + (static_cast<int64_t>(b) * n_heads + h) * L;
      for (int t = 0; t < len; ++t) {
        const float* qi = q + (row0 + t) * qs + qh;
        const float* gi = dout + (row0 + t) * qs + qh;
        float* dqi = dq + (row0 + t) * qs + qh;
        float D = 0.0f;  // sum_u p_u dp_u  (= dout . out)
        for (int u = 0; u <= t; ++u) {
          p[u] = std::exp(scale * dot(qi, k + (row0 + u) * ks + kh, head_dim) - lse_bh[t]);
          dp[u] = dot(gi, v + (row0 + u) * ks + kh, head_dim);
          D += p[u] * dp[u];
        }
        for (int u = 0; u <= t; ++u) {
          const float ds = scale * p[u] * (dp[u] - D);
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
