// rope_freq.h: the rotary embeddings' inverse frequencies of a model config (plain, Llama-3 and YaRN scaled), on the
// host.
#pragma once

namespace mgrl::model {

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

// YaRN's frequencies (config.json rope_scaling of rope_type "yarn").
struct YarnRopeScaling {
  double factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double original_max_position_embeddings = 4096.0;
  bool truncate = true;
};

// transformers' _compute_yarn_parameters, in its fp32 steps: with p[j] = rope_theta^(2j / head_dim),
//   extrapolation e[j] = 1 / p[j], interpolation i[j] = 1 / (factor * p[j]);
//   the correction dimension of r rotations: d(r) = head_dim * ln(orig / (2 pi r)) / (2 ln rope_theta);
//   low = d(beta_fast), high = d(beta_slow) (floor and ceil when truncate), clamped to [0, head_dim - 1];
//   ramp[j] = clamp((j - low) / (high - low), 0, 1) (high += 0.001 when equal); w = 1 - ramp;
//   inv_freq[j] = i[j] * (1 - w[j]) + e[j] * w[j].
// Its attention factor (cos and sin multiplied by it) is io::RopeScaling::attention_factor.
void rope_yarn_inv_freq(float* inv_freq, int head_dim, double rope_theta, const YarnRopeScaling& s);

}  // namespace mgrl::model
