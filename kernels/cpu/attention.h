// attention.h: causal grouped-query attention over packed variable-length sequences (no padding), forward (saves
// the log-sum-exp) and backward.
#pragma once
#include <cstdint>

#include "kernels/attention_options.h"

namespace mgrl::kernels::cpu {

// A packed batch of B sequences stored back to back: sequence b owns token rows cu_seqlens[b] .. cu_seqlens[b+1] - 1
// (cu_seqlens[0] = 0, non-decreasing, cu_seqlens[B] = T; a sequence may be empty). Shapes (row-major):
//   q, out, dq, dout: [T, n_heads, head_dim];  k, v, dk, dv: [T, n_kv, head_dim];  lse: [n_heads, T]
// Query head h reads kv head h / (n_heads / n_kv). The query at position t of a sequence attends to the keys at
// positions u <= t of the same sequence, with scale 1/sqrt(head_dim); it never sees another sequence's rows.
// opt (kernels/attention_options.h) changes the scale, limits the keys to a sliding window and soft-caps the
// scores; the backward must get the forward's opt.
// max_len (>= every sequence's length) sizes the row buffers: the op allocates one of max_len floats.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv, int head_dim,
                       const AttentionOptions& opt = {});

// Given dout and the forward's q, k, v and lse, writes dq, dk, dv (every row; dk/dv sum over the n_heads / n_kv
// query heads of each group). Softmax recomputed from lse:
//   p = exp(s - lse), dp = dout . v, ds = p * (dp - sum_u p_u dp_u), dq = scale * ds @ k, dk = scale * ds^T @ q,
//   dv = p^T @ dout; with soft-capping ds is multiplied by the tanh's derivative 1 - (s / softcap)^2 (s capped).
// The op allocates two row buffers of max_len floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, const int32_t* cu_seqlens, int B, int T, int max_len,
                        int n_heads, int n_kv, int head_dim, const AttentionOptions& opt = {});

}  // namespace mgrl::kernels::cpu
