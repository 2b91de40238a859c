// rope.cpp: rotary position embedding forward/backward (rotation by +angle / -angle).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

namespace {

// Rotates every head of every row by sign * angle.
void rope_rotate(float* x, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim, float sign) {
  MGRL_CHECK(head_dim % 2 == 0, "rope needs an even head_dim");
  const int half = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int t = 0; t < T; ++t) {
    const float p = static_cast<float>(pos[t]);
    for (int j = 0; j < half; ++j) {
      const float a = p * inv_freq[j];
      c[j] = static_cast<float>(std::cos(static_cast<double>(a)));
      s[j] = sign * static_cast<float>(std::sin(static_cast<double>(a)));
    }
    float* row = x + static_cast<int64_t>(t) * n_heads * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + static_cast<int64_t>(h) * head_dim;
      for (int j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j] + a * s[j];
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim) {
  rope_rotate(x, pos, inv_freq, T, n_heads, head_dim, 1.0f);
}

void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim) {
  rope_rotate(dx, pos, inv_freq, T, n_heads, head_dim, -1.0f);
}

}  // namespace mgrl::kernels::cpu
