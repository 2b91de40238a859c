// dropout.cuh: inverted dropout with the counter-based mask of kernels::dropout_keep (ops.h), elementwise.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// x, out [rows, cols] (storage dtype; out may alias x): out[t, j] = dropout_keep(random_bits(seed, row_keys[t]), j, p)
// ? x[t, j] * (1 / (1 - p)) : 0, row_keys u64 [rows] in device memory. The mask is kernels::dropout_keep itself
// (ops.h, host and device via core/random.h), so it is the CPU's mask.
// x [rows, cols] (storage dtype) += row_scale[t] * kernels::noise_uniform(random_bits(seed, row_keys[t]), j), the sum
// in f32 rounded to the storage dtype (Ops::add_uniform_noise: NEFTune); row_scale f32 and row_keys u64 [rows] in
// device memory.
void add_uniform_noise(const Ctx& c, void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                       const std::uint64_t* row_keys);
void dropout(const Ctx& c, void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
             const std::uint64_t* row_keys);

}  // namespace mgrl::kernels::cuda
