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

// The residual add, then the RMSNorm of its result, in one pass over each row (a decoder block's residual before its
// MLP norm):
//   x_out[r, i] = x_in[r, i] + y[r, i]            (as residual_forward: one rounding to the storage dtype)
//   h[r, :], rstd[r] = rmsnorm_forward of x_out[r, :]
// Bit for bit the same as copying x_in to x_out, residual_forward(x_out, y), then rmsnorm_forward(h, rstd, x_out).
// x_out may alias x_in (the inference engine's in-place residual stream); h must not alias x_in, x_out or y.
void residual_rmsnorm_forward(float* x_out, float* h, float* rstd, const float* x_in, const float* y, const float* w,
                              int rows, int dim, float eps, bool unit_offset = false);

// Given dout, the forward's input x and its saved rstd:
//   dx[r, :]  = rstd * (dout*w) - rstd^3 / dim * x * sum(dout * w * x)   (written, or added when accumulate)
//   dw[i]    += sum_r dout[r, i] * x[r, i] * rstd[r]                      (always accumulates; dw may be null)
// dx may be null (only dw wanted). dx must not alias x or dout.
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int rows, int dim, bool accumulate, bool unit_offset = false);

}  // namespace mgrl::kernels::cpu
