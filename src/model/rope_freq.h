// rope_freq.h: the rotary embeddings' inverse frequencies of a model config (plain and Llama-3 scaled), on the host.
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

}  // namespace mgrl::model
