// lora.cuh: fused LoRA adapter kernels, y += scale * (x @ A^T) @ B^T, and its backward (dA, dB, added dx).
#pragma once
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Largest LoRA rank these kernels take (shared-memory tiles hold kOuterRows * r floats).
inline constexpr int kMaxLoraRank = 256;

// Semantics of kernels/cpu/lora.h: x, y, dy, dx in storage dtype; A [r, in], B [out, r], xa [T, r], dA, dB and
// scratch (T * r floats, or null: then the op takes stream-ordered scratch itself) f32. Custom kernels, no cuBLAS.
void lora_forward(const Ctx& c, void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                  int in, int r, int out);
void lora_backward(const Ctx& c, void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa,
                   const float* A, const float* B, float scale, int T, int in, int r, int out, float* scratch);

}  // namespace mgrl::kernels::cuda
