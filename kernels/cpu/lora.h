// lora.h: LoRA adapter on a linear layer, y += scale * (x @ A^T) @ B^T, and its backward; a group of adapters
// that read the same x, their products over x stacked; and an adapter merged into its layer's weight.
#pragma once
#include "kernels/lora_group.h"

namespace mgrl::kernels::cpu {

// A is [r, in] (PEFT lora_A), B is [out, r] (PEFT lora_B), scale = lora_alpha / r (or alpha / sqrt(r) for rsLoRA).
//   xa[T, r]   = x[T, in] @ A^T          (written; saved for the backward)
//   y[T, out] += scale * xa @ B^T         (accumulates onto the base layer's output)
// No dropout: x is used as given.
void lora_forward(float* y, float* xa, const float* x, const float* A, const float* B, float scale, int T, int in,
                  int r, int out);

// Given dy[T, out], the forward's x and its saved xa:
//   dB[out, r] += scale * dy^T @ xa
//   dA[r, in]  += (scale * dy @ B)^T @ x
//   dx[T, in]  += (scale * dy @ B) @ A     (adds to the base layer's dx; dx may be null)
// dA and dB always accumulate and may be null. scratch holds T * r floats (scale * dy @ B); when it is null
// the op allocates that buffer itself.
void lora_backward(float* dx, float* dA, float* dB, const float* dy, const float* x, const float* xa, const float* A,
                   const float* B, float scale, int T, int in, int r, int out, float* scratch);

// A group of n members reading the same x [T, in] (kernels/lora_group.h; y, dy, dx f32 here), as lora_forward /
// lora_backward of each member in turn, with the products that touch x stacked over the members:
//   forward   P[T, n r] = x @ [A_1; ..; A_n]^T (one GEMM), xa_m = P's columns m r .. m r + r - 1,
//             y_m += scale_m * xa_m @ B_m^T
//   backward  dB_m += scale_m * dy_m^T @ xa_m,  dxa[:, m r ..] = scale_m * dy_m @ B_m  (per member)
//             [dA_1; ..; dA_n] += dxa^T @ x,  dx += dxa @ [A_1; ..; A_n]            (one GEMM each)
// scratch: lora_group_scratch_floats(T, in, r, n) floats (null: allocated here).
void lora_group_forward(const LoraMember* g, int n, const float* x, int T, int in, int r, float* scratch);
void lora_group_backward(float* dx, const LoraMember* g, int n, const float* x, int T, int in, int r, float* scratch);

// The adapter merged into its layer's weight (sampling with merged weights, generate.merge_lora):
//   Wm[o, i] = W[o, i] + scale * acc[o, i],  acc[o, i] = sum_{k = 0 .. r-1} B[o, k] * A[k, i]
// acc is summed in f32 in the order k = 0, 1, .., r-1 (each product rounded, then added; no fused multiply-add),
// then scale * acc is rounded and added to W[o, i]: one rounding into the storage dtype (here f32). W, Wm
// [out, in]; Wm may be W (in place).
void lora_merge(float* Wm, const float* W, const float* A, const float* B, float scale, int out, int in, int r);

}  // namespace mgrl::kernels::cpu
