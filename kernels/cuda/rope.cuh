// rope.cuh: rotary position embedding (HF rotate-half), in place, forward (rotation by +angle) and backward (-angle).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/rope.h: x [T, n_heads, head_dim] in storage dtype, pos [T] int32, inv_freq
// [head_dim / 2] f32 (device memory). head_dim must be even.
void rope_forward(const Ctx& c, void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                  int head_dim);
void rope_backward(const Ctx& c, void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                   int head_dim);

}  // namespace mgrl::kernels::cuda
