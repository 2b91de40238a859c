// rmsnorm.h: RMSNorm over the last dimension (HF Llama/Qwen semantics) and its backward.
#pragma once

namespace mgrl::kernels::cpu {

// For each of `rows` rows of length `dim`:
//   rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps)
//   out[r, i] = (x[r, i] * rstd[r]) * w[i]      (normalise first, then scale by the weight)
// Per-head norms (Qwen3 q_norm / k_norm) are the same call with rows = T * n_heads, dim = head_dim.
// unit_offset (Gemma): the scale is (1 + w[i]) instead of w[i], everywhere below.
// rstd ([rows]) is saved for the backward; out may alias x.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int rows, int dim, float eps,
                     bool unit_offset = false);

// Given dout, the forward's input x and its saved rstd:
//   dx[r, :]  = rstd * (dout*w) - rstd^3 / dim * x * sum(dout * w * x)   (written, or added when accumulate)
//   dw[i]    += sum_r dout[r, i] * x[r, i] * rstd[r]                      (always accumulates; dw may be null)
// dx may be null (only dw wanted). dx must not alias x or dout.
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int rows, int dim, bool accumulate, bool unit_offset = false);

}  // namespace mgrl::kernels::cpu
