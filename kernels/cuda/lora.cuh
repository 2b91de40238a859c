// lora.cuh: LoRA adapter kernels, y += scale * (x @ A^T) @ B^T, and its backward (dA, dB, added dx); one adapter or a
// group sharing x; the adapter merged into its weight.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/lora_group.h"

namespace mgrl::kernels::cuda {

// Largest LoRA rank these kernels take (shared-memory tiles hold kOuterRows * r floats).
inline constexpr int kMaxLoraRank = 256;

// Semantics of kernels/cpu/lora.h: x, y, dy, dx in storage dtype; A [r, in], B [out, r], xa [T, r], dA, dB and
// scratch (T * r floats, or null: then the op takes stream-ordered scratch itself) f32. Custom kernels, no cuBLAS.
void lora_forward(const Ctx& c, void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                  int in, int r, int out);
void lora_backward(const Ctx& c, void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa,
                   const float* A, const float* B, float scale, int T, int in, int r, int out, float* scratch);

// A group of members reading the same x (kernels/cpu/lora.h, lora_group_forward / lora_group_backward): on the cuBLAS
// path the products over x run stacked in one GEMM each; MGRL_CUDA_LORA=fused runs the members one by one. The
// op takes its scratch stream-ordered.
void lora_group_forward(const Ctx& c, const LoraMember* g, int n, const void* x, int T, int in, int r);
void lora_group_backward(const Ctx& c, void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r);

// linear_forward (no bias) of each member's weight W[m] [out, in] into g[m].y, then lora_group_forward, as one GEMM a
// member over concatenated operands ([x | xa] [W | scale B]^T; lora.cu gemm_concat_forward), when MGRL_LORA_CONCAT=1
// and the members' outputs are wider than x; false (nothing queued) otherwise.
bool lora_concat_forward(const Ctx& c, const LoraMember* g, const void* const* W, int n, const void* x, int T, int in,
                         int r);

// kernels/cpu/lora.h lora_merge: Wm = W + scale * B A in the storage dtype (Wm may be W), the sum over k in f32 in
// the CPU reference's order and roundings (unfused), so that the result equals the reference's f32 value rounded
// once. A tiled kernel (A and B tiles in shared memory), no cuBLAS; memory-bound (reads W, writes Wm).
void lora_merge(const Ctx& c, void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in,
                int r);

}  // namespace mgrl::kernels::cuda
