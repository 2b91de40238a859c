// rmsnorm.cuh: RMSNorm over the last dimension (HF Llama/Qwen semantics; per-head norms too) and its backward.
#pragma once
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/rmsnorm.h: x, w, out, dout, dx in storage dtype; rstd [rows] and dw [dim] f32.
// out may alias x. dx may be null (only dw) and dw may be null (only dx).
// unit_offset (Gemma): the scale is (1 + w), computed in fp32 (transformers: the norm in fp32 times 1 + w.float()).
void rmsnorm_forward(const Ctx& c, void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                     bool unit_offset = false);
void rmsnorm_backward(const Ctx& c, void* dx, float* dw, const void* dout, const void* x, const void* w,
                      const float* rstd, int rows, int dim, bool accumulate, bool unit_offset = false);

}  // namespace mgrl::kernels::cuda
