// gemv.cuh: small-M products for the decode step (T <= 8 rows of x against a weight read once): q|k|v with their
// biases, gate|up with the activation, down with the residual add (kernels/ops.h's fused inference ops).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// The most rows of x one launch takes (a template parameter of the kernels).
inline constexpr int kGemvMaxRows = 8;

// Whether the GEMV kernels take a call: 1 <= T <= kGemvMaxRows, in > 0 a multiple of 8, and x and every weight
// 16-byte aligned (16-byte loads of 8 elements along `in`). Outputs, biases and the residual have no alignment rule.
bool gemv_fits(int T, int in, const void* x, const void* const* W, int n);

// Each returns false, launching nothing, when gemv_fits does not hold (the caller then runs the separate ops).
// Ops::linear_group_forward: m[i].y = x m[i].W^T + m[i].bias for n <= Ops::kMaxLinearGroup members, one launch.
bool gemv_group(const Ctx& c, const Ops::LinearMember* m, int n, const void* x, int T, int in);
// Ops::gated_mlp_forward without the gate and up buffers: act = f(round(x Wg^T)) * round(x Wu^T).
bool gemv_gated(const Ctx& c, void* act, const void* x, const void* Wg, const void* Wu, int T, int in, int I,
                bool geglu);
// Ops::linear_residual_forward without tmp: y = r + round(x W^T) (y may be r).
bool gemv_residual(const Ctx& c, void* y, const void* r, const void* x, const void* W, int T, int in, int out);

}  // namespace mgrl::kernels::cuda
