// swiglu.cuh: the gated MLP activations, SwiGLU (Llama/Qwen) and GeGLU with the tanh GELU (Gemma), and their
// backwards (elementwise).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// The activations of one element from the gate and up values (fp32 math, the accurate expf / tanhf), shared by the
// elementwise kernels and the fused gate|up GEMV (gemv.cu) so that both give the same bits from the same inputs.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float sig = 1.0f / (1.0f + expf(-g));
  return g * sig * u;
}
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluA = 0.044715f;
__device__ __forceinline__ float geglu_value(float g, float u) {
  return 0.5f * g * (1.0f + tanhf(kGeluC * (g + kGeluA * g * g * g))) * u;
}

// Semantics of kernels/cpu/swiglu.h (storage dtype; out may alias gate or up, dgate/dup may alias dout).
void swiglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n);
void swiglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                     std::int64_t n);
// GeGLU with the tanh GELU (Gemma), semantics of kernels/cpu/swiglu.h's geglu_*; same aliasing rules.
void geglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n);
void geglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                    std::int64_t n);

// Ops::gated_mlp_forward when Wu follows Wg in memory (the [2I, in] stack of gate_proj and up_proj: the dense base
// arena always, the merged copy and the NF4 workspace when a projection is a multiple of 16 bytes): one cuBLAS GEMM
// of x against the stack into stream-ordered scratch [T, 2I], then act = f(gate) * up from its two halves in one
// elementwise pass; two GEMMs and the activation pass otherwise. False (nothing queued) when Wu does not follow Wg.
bool gated_mlp_stacked(const Ctx& c, void* act, const void* x, const void* Wg, const void* Wu, int T, int in, int I,
                       bool geglu);

}  // namespace mgrl::kernels::cuda
