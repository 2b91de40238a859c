// rope_freq.cpp: the rotary inverse frequencies, step by step in fp32 as transformers computes them.
#include "model/rope_freq.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mgrl::model {
namespace {

// transformers' pos_freqs[j] = base ** (arange(0, dim, 2).float() / dim), in fp32.
float rope_power(double rope_theta, int j, int head_dim) {
  const float e = static_cast<float>(2 * j) / static_cast<float>(head_dim);
  return static_cast<float>(std::pow(static_cast<double>(static_cast<float>(rope_theta)), static_cast<double>(e)));
}

}  // namespace

void rope_inv_freq(float* inv_freq, int head_dim, double rope_theta, const Llama3RopeScaling* scaling) {
  MGRL_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope needs an even head_dim");
  const int half = head_dim / 2;
  // transformers: 1.0 / pos_freqs, all in fp32.
  for (int j = 0; j < half; ++j) inv_freq[j] = 1.0f / rope_power(rope_theta, j, head_dim);
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

void rope_yarn_inv_freq(float* inv_freq, int head_dim, double rope_theta, const YarnRopeScaling& s) {
  rope_inv_freq(inv_freq, head_dim, rope_theta, nullptr);  // the extrapolation: 1 / p[j] (fp32)
  const int half = head_dim / 2;
  const double pi = 3.14159265358979323846, dim = head_dim, orig = s.original_max_position_embeddings;
  const auto correction_dim = [&](double rotations) {  // Python floats (double)
    return dim * std::log(orig / (rotations * 2 * pi)) / (2 * std::log(rope_theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  const float factor = static_cast<float>(s.factor);
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  for (int j = 0; j < half; ++j) {
    const float e = inv_freq[j];
    const float interp = 1.0f / (factor * rope_power(rope_theta, j, head_dim));  // 1 / (factor * pos_freqs), fp32
    const float ramp = std::min(std::max((static_cast<float>(j) - lo) / span, 0.0f), 1.0f);
    const float w = 1.0f - ramp;  // the extrapolation's weight
    inv_freq[j] = interp * (1.0f - w) + e * w;
  }
}

}  // namespace mgrl::model
