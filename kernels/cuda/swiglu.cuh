// swiglu.cuh: the SwiGLU gate of the Llama/Qwen MLP, out = silu(gate) * up, and its backward (elementwise).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/swiglu.h (storage dtype; out may alias gate or up, dgate/dup may alias dout).
void swiglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n);
void swiglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                     std::int64_t n);

}  // namespace mgrl::kernels::cuda
