// swiglu.h: the SwiGLU gate of the Llama/Qwen MLP, out = silu(gate) * up, and its backward.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// out[i] = silu(gate[i]) * up[i] for i < n, silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);

// dgate[i] = dout[i] * up[i] * silu'(gate[i]),  silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
// dup[i]   = dout[i] * silu(gate[i])
// Both written. dgate and dup may alias dout (elementwise), not gate or up.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

}  // namespace mgrl::kernels::cpu
