// rope.cpp: rotary position embedding forward/backward (rotation by +angle / -angle) and inverse frequencies.
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

void rope_inv_freq(float* inv_freq, int head_dim, double rope_theta, const Llama3RopeScaling* scaling) {
  MGRL_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope needs an even head_dim");
  const int half = head_dim / 2;
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32.
  const float base = static_cast<float>(rope_theta);
  for (int j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv_freq[j] = 1.0f / p;
  }
  if (!scaling) return;
  const double orig = scaling->original_max_position_embeddings;
  const float factor = static_cast<float>(scaling->factor);
  const float low = static_cast<float>(scaling->low_freq_factor);
  const float low_wl = static_cast<float>(orig / scaling->low_freq_factor);
  const float high_wl = static_cast<float>(orig / scaling->high_freq_factor);
  const float span = static_cast<float>(scaling->high_freq_factor - scaling->low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);  // 2 * math.pi
  for (int j = 0; j < half; ++j) {
    const float f = inv_freq[j];
    const float wavelen = two_pi / f;
    const float f_llama = wavelen > low_wl ? f / factor : f;
    const float s = (static_cast<float>(orig) / wavelen - low) / span;
    const float smoothed = (1.0f - s) * f_llama / factor + s * f_llama;
    const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
    inv_freq[j] = medium ? smoothed : f_llama;
  }
}

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
