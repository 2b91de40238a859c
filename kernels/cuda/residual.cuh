// residual.cuh: the residual connection, x += y in place or out = a + b (elementwise, fp32 add, one rounding).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/residual.h (storage dtype). x may equal y (x = 2x).
void residual_forward(const Ctx& c, void* x, const void* y, std::int64_t n);
// out = a + b (residual.h's residual_add); out may alias a or b. 16-byte vectors when n and the pointers allow.
void residual_add(const Ctx& c, void* out, const void* a, const void* b, std::int64_t n);

}  // namespace mgrl::kernels::cuda
