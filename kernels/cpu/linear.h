// linear.h: dense layer y = x @ W^T (+ bias) with W in HF layout [out, in], and its backward (cblas_sgemm).
#pragma once

namespace mgrl::kernels::cpu {

// y[T, out] = x[T, in] @ W[out, in]^T + bias[out]   (bias may be null). y must not alias x.
void linear_forward(float* y, const float* x, const float* W, const float* bias, int T, int in, int out);

// Given dy[T, out] (each output is skipped when its pointer is null):
//   dx[T, in]    = dy @ W        (written; added to dx when accumulate_dx)
//   dW[out, in] += dy^T @ x      (always accumulates)
//   dbias[out]  += sum_t dy[t, :] (always accumulates)
void linear_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x, const float* W, int T, int in,
                     int out, bool accumulate_dx);

}  // namespace mgrl::kernels::cpu
