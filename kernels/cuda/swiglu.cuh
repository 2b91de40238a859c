// swiglu.cuh: the gated MLP activations, SwiGLU (Llama/Qwen) and GeGLU with the tanh GELU (Gemma), and their
// backwards (elementwise).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/swiglu.h (storage dtype; out may alias gate or up, dgate/dup may alias dout).
void swiglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n);
void swiglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                     std::int64_t n);
// GeGLU with the tanh GELU (Gemma), semantics of kernels/cpu/swiglu.h's geglu_*; same aliasing rules.
void geglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n);
void geglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                    std::int64_t n);

}  // namespace mgrl::kernels::cuda
