// rope.h: rotary position embedding (HF Llama rotate-half convention) and its backward; the inverse frequencies
// inv_freq are computed by the model (src/model/rope_freq.h).
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// In place on x[T, n_heads, head_dim] (call once for q, once for k). For token row t the angle of pair
// (j, j + head_dim/2) is a = pos[t] * inv_freq[j] (fp32 product, as in transformers) and
//   x[j]      <- x[j] * cos(a) - x[j + hd/2] * sin(a)
//   x[j+hd/2] <- x[j + hd/2] * cos(a) + x[j] * sin(a)
// head_dim must be even.
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim);

// The backward is the rotation by -a, in place on the gradient dx[T, n_heads, head_dim].
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim);

}  // namespace mgrl::kernels::cpu
