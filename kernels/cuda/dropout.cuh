// dropout.cuh: inverted dropout with the counter-based mask of kernels::dropout_keep (ops.h), elementwise.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// out[i] = dropout_keep(seed, i, p) ? x[i] * (1 / (1 - p)) : 0 for i < n (storage dtype; out may alias x).
// The mask is kernels::dropout_keep itself (ops.h, host and device via core/random.h), so it is the CPU's mask.
void dropout(const Ctx& c, void* out, const void* x, std::int64_t n, float p, std::uint64_t seed);

}  // namespace mgrl::kernels::cuda
