// attention.cuh: causal grouped-query attention over a right-padded batch, forward (saves lse) and backward.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Largest head_dim the kernels take (per-block shared-memory rows).
inline constexpr int kMaxHeadDim = 256;

// Semantics of kernels/cpu/attention.h: q, out, dq, dout [B*L, n_heads, head_dim], k, v, dk, dv [B*L, n_kv, head_dim]
// in storage dtype; lse [B, n_heads, L] f32; lengths [B] int32 on the device. A length outside [0, L] is clamped
// and sets kErrLength in *c.err (the host reports it at its next sync). The backward also takes the forward's
// output `out`. head_dim 64 and 128 run the tiled tensor-core kernels of flash_attention.cu where they apply
// (flash_attention_applies), everything else the straightforward kernels below; both take stream-ordered scratch
// in the backward (see flash_attention.cuh; naive: B * n_heads * L floats).
void attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                       const std::int32_t* lengths, int B, int L, int n_heads, int n_kv, int head_dim);
void attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                        const void* k, const void* v, const float* lse, const std::int32_t* lengths, int B, int L,
                        int n_heads, int n_kv, int head_dim);

// The straightforward kernels alone (one block per row, no tiling, no tensor cores), any head_dim <= kMaxHeadDim:
// the fallback, and the baseline of perf/bench_attention.
void attention_forward_naive(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* lengths, int B, int L, int n_heads, int n_kv, int head_dim);
void attention_backward_naive(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const float* lse, const std::int32_t* lengths, int B,
                              int L, int n_heads, int n_kv, int head_dim);

}  // namespace mgrl::kernels::cuda
