// rmsnorm.cuh: RMSNorm over the last dimension (HF Llama/Qwen semantics; per-head norms too), the residual add fused
// before it, and the backward.
#pragma once
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/rmsnorm.h: x, w, out, dout, dx in storage dtype; rstd [rows] and dw [dim] f32.
// out may alias x. dx may be null (only dw) and dw may be null (only dx).
// Forward and dx run on row groups (one to 512 threads per row, the row in registers, 16-byte loads when dim is a
// multiple of 8 and the pointers are 16-byte aligned); MGRL_FUSED_NORM=0 (read once) brings back the one-block-per-row
// kernels, and residual_rmsnorm_forward then runs as residual_add + rmsnorm_forward.
// unit_offset (Gemma): the scale is (1 + w), computed in fp32 (transformers: the norm in fp32 times 1 + w.float()).
void rmsnorm_forward(const Ctx& c, void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                     bool unit_offset = false);
// x_out = x_in + y (rounded to the storage dtype), then h = rmsnorm(x_out) and rstd, in one pass (rmsnorm.h). x_out
// may alias x_in.
void residual_rmsnorm_forward(const Ctx& c, void* x_out, void* h, float* rstd, const void* x_in, const void* y,
                              const void* w, int rows, int dim, float eps, bool unit_offset = false);
void rmsnorm_backward(const Ctx& c, void* dx, float* dw, const void* dout, const void* x, const void* w,
                      const float* rstd, int rows, int dim, bool accumulate, bool unit_offset = false);

}  // namespace mgrl::kernels::cuda
