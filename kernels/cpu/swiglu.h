// swiglu.h: the gated activations of the MLP, SwiGLU (Llama/Qwen: out = silu(gate) * up) and GeGLU with the
// tanh-approximated GELU (Gemma: out = gelu_tanh(gate) * up), and their backwards.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// out[i] = silu(gate[i]) * up[i] for i < n, silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);

// dgate[i] = dout[i] * up[i] * silu'(gate[i]),  silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
// dup[i]   = dout[i] * silu(gate[i])
// Both written. dgate and dup may alias dout (elementwise), not gate or up.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// out[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3)))
// (transformers' gelu_pytorch_tanh). out may alias gate or up.
void geglu_forward(float* out, const float* gate, const float* up, int64_t n);

// dgate[i] = dout[i] * up[i] * gelu_tanh'(gate[i]), dup[i] = dout[i] * gelu_tanh(gate[i]); aliasing as swiglu's.
//   gelu_tanh'(g) = (1 + t) / 2 + g / 2 * (1 - t^2) * sqrt(2 / pi) * (1 + 3 * 0.044715 g^2),  t = tanh(...)
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

}  // namespace mgrl::kernels::cpu
