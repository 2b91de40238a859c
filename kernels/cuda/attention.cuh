// attention.cuh: causal grouped-query attention over a right-padded batch, forward (saves lse) and backward.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Largest head_dim the kernels take (per-block shared-memory rows).
inline constexpr int kMaxHeadDim = 256;

// Semantics of kernels/cpu/attention.h: q, out, dq, dout [B*L, n_heads, head_dim], k, v, dk, dv [B*L, n_kv, head_dim]
// in storage dtype; lse [B, n_heads, L] f32; lengths [B] int32 on the device. A length outside [0, L] is clamped
// and sets kErrLength in *c.err (the host reports it at its next sync). The backward takes B * n_heads * L floats
// of stream-ordered scratch.
void attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                       const std::int32_t* lengths, int B, int L, int n_heads, int n_kv, int head_dim);
void attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                        const void* v, const float* lse, const std::int32_t* lengths, int B, int L, int n_heads,
                        int n_kv, int head_dim);

}  // namespace mgrl::kernels::cuda
