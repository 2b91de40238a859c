// attention.h: causal grouped-query attention over a right-padded batch, forward (saves logsumexp) and backward.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// Shapes (row-major; token row = b * L + t):
//   q, out, dq, dout: [B*L, n_heads, head_dim];  k, v, dk, dv: [B*L, n_kv, head_dim];  lse: [B, n_heads, L]
// Sequence b holds lengths[b] valid tokens at t < lengths[b] (right padding). Query head h reads kv head
// h / (n_heads / n_kv). Query t attends to keys u <= t with scale 1/sqrt(head_dim); keys at padding are never
// seen (u <= t < lengths[b]). Query rows at padding give out = 0 and lse = 0.
// The op allocates one row buffer of L floats.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* lengths,
                       int B, int L, int n_heads, int n_kv, int head_dim);

// Given dout and the forward's q, k, v and lse, writes dq, dk, dv (all rows: padding rows get 0; dk/dv sum over
// the n_heads / n_kv query heads of each group). Softmax recomputed from lse:
//   p = exp(s - lse), dp = dout . v, ds = p * (dp - sum_u p_u dp_u), dq = scale * ds @ k, dk = scale * ds^T @ q,
//   dv = p^T @ dout.
// The op allocates two row buffers of L floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, const int32_t* lengths, int B, int L, int n_heads, int n_kv,
                        int head_dim);

}  // namespace mgrl::kernels::cpu
