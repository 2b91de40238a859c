// optimizer.cuh: AdamW and the squared norm on the GPU (f32 buffers), as kernels/cpu/optimizer.h defines them.
#pragma once
#include <cstddef>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// Writes sum(x^2) (double) into *out_device (zeroed first); the caller downloads it.
void sum_squares(const Ctx& c, double* out_device, const float* x, std::size_t n);
// *acc_device += scale * sum(w * x) in double: one block, a fixed order of additions (deterministic), no atomics.
void weighted_sum_accumulate(const Ctx& c, double* acc_device, const float* x, const float* w, std::size_t n,
                             double scale);
void adamw(const Ctx& c, float* params, const float* grads, float* m, float* v, std::size_t n, const Ops::AdamW& hp);

}  // namespace mgrl::kernels::cuda
