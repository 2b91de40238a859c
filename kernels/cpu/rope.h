// rope.h: rotary position embedding (HF Llama rotate-half convention), its backward, and the inverse frequencies.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// Llama-3 frequency scaling (config.json "rope_scaling" with rope_type "llama3").
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// inv_freq[j] for j < head_dim/2, as transformers computes them in fp32:
//   inv_freq[j] = 1 / rope_theta^(2j / head_dim)
// and, with `scaling` (null for none), transformers' _compute_llama3_parameters:
//   wavelen = 2*pi / inv_freq;  low_wl = orig / low_freq_factor;  high_wl = orig / high_freq_factor
//   wavelen > low_wl                 -> inv_freq / factor
//   high_wl <= wavelen <= low_wl     -> (1 - s) * inv_freq / factor + s * inv_freq,
//                                       s = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   wavelen < high_wl                -> inv_freq
// The arithmetic follows transformers' fp32 operations step by step.
void rope_inv_freq(float* inv_freq, int head_dim, double rope_theta, const Llama3RopeScaling* scaling);

// In place on x[T, n_heads, head_dim] (call once for q, once for k). For token row t the angle of pair
// (j, j + head_dim/2) is a = pos[t] * inv_freq[j] (fp32 product, as in transformers) and
//   x[j]      <- x[j] * cos(a) - x[j + hd/2] * sin(a)
//   x[j+hd/2] <- x[j + hd/2] * cos(a) + x[j] * sin(a)
// head_dim must be even.
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim);

// The backward is the rotation by -a, in place on the gradient dx[T, n_heads, head_dim].
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim);

}  // namespace mgrl::kernels::cpu
