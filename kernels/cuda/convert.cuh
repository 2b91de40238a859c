// convert.cuh: elementwise conversion between f32 and the storage dtype (for uploads and downloads).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// dst[i] = storage(src[i]) (round to nearest even), i < n; both device pointers.
void f32_to_storage(const Ctx& c, void* dst, const float* src, std::int64_t n);
// dst[i] = float(src[i]) (exact), i < n; both device pointers.
void storage_to_f32(const Ctx& c, float* dst, const void* src, std::int64_t n);

}  // namespace mgrl::kernels::cuda
