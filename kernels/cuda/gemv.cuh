// gemv.cuh: small-M products for the decode step (T <= 8 rows of x against a weight read once): q|k|v with their
// biases, gate|up with the activation, down with the residual add (kernels/ops.h's fused inference ops).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// The most rows of x one launch takes (a template parameter of the kernels).
inline constexpr int kGemvMaxRows = 8;

// Beyond kGemvLargeMaxRows rows of x, weights of more than kGemvLargeBytes (all `rows` of the call together) go to
// cuBLAS. Measured on an H200 (perf/bench_gemv, 2026-11-27): every warp reads its x rows again for each weight load,
// from L2 once x outgrows L1, so at T >= 4 the kernels fell behind cuBLAS on the 7B shape's large matrices (gate|up,
// 271 MB: 1.12x at T = 4 but 0.71x at T = 8; down, 136 MB: 0.81x at T = 4, 0.42x at T = 8), while below 64 MiB they
// stayed ahead at every T (the 0.5B shape's 1.3-5.5x; 7B's q|k|v, 33 MB: 1.67x at T = 8).
inline constexpr int kGemvLargeMaxRows = 2;
inline constexpr std::int64_t kGemvLargeBytes = std::int64_t{64} << 20;
inline bool gemv_size_ok(int T, std::int64_t weight_bytes) {
  return T <= kGemvLargeMaxRows || weight_bytes <= kGemvLargeBytes;
}

// Whether the GEMV kernels take a call of T rows of x against `rows` weight rows of `in` 2-byte elements: 1 <= T <=
// kGemvMaxRows, the size rule above, in > 0 a multiple of 8, and x and every weight 16-byte aligned (16-byte loads of
// 8 elements along `in`). Outputs, biases and the residual have no alignment rule.
bool gemv_fits(int T, int in, std::int64_t rows, const void* x, const void* const* W, int n);

// Each returns false, launching nothing, when gemv_fits does not hold (the caller then runs the separate ops).
// With norm_w (16-byte aligned, else false) an RMSNorm of x is folded in (Ops::rmsnorm_linear_group_forward,
// rmsnorm_gated_mlp_forward): x times norm_w (+ 1 with unit_offset) in fp32 along the products, the sum of squares
// of x beside, the products scaled by the row's 1 / sqrt(mean(x^2) + eps) at the end.
// Ops::linear_group_forward: m[i].y = x m[i].W^T + m[i].bias for n <= Ops::kMaxLinearGroup members, one launch.
bool gemv_group(const Ctx& c, const Ops::LinearMember* m, int n, const void* x, int T, int in,
                const void* norm_w = nullptr, float eps = 0.0f, bool unit_offset = false);
// Ops::gated_mlp_forward without the gate and up buffers: act = f(round(x Wg^T)) * round(x Wu^T).
bool gemv_gated(const Ctx& c, void* act, const void* x, const void* Wg, const void* Wu, int T, int in, int I,
                bool geglu, const void* norm_w = nullptr, float eps = 0.0f, bool unit_offset = false);
// Whether gemv_gated would take these operands.
bool gemv_gated_fits(const void* x, const void* Wg, const void* Wu, int T, int in, int I, const void* norm_w);
// Ops::linear_residual_forward without tmp: y = r + round(x W^T) (y may be r).
bool gemv_residual(const Ctx& c, void* y, const void* r, const void* x, const void* W, int T, int in, int out);

}  // namespace mgrl::kernels::cuda
