// linear.cuh: dense layer y = x @ W^T (+ bias) on cuBLAS, and its backward (dx, f32 dW, f32 dbias).
#pragma once
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/linear.h; x, W, bias, y, dy, dx in storage dtype, dW and dbias f32.
void linear_forward(const Ctx& c, void* y, const void* x, const void* W, const void* bias, int T, int in, int out);
void linear_backward(const Ctx& c, void* dx, float* dW, float* dbias, const void* dy, const void* x, const void* W,
                     int T, int in, int out, bool accumulate_dx);

}  // namespace mgrl::kernels::cuda
