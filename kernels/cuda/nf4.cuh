// nf4.cuh: NF4 weights (bitsandbytes' layout, kernels/cpu/nf4.h) dequantized into a bf16/fp16 workspace on the GPU.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// Semantics of Ops::dequantize_nf4: elements [begin, end) of w into dst[0 .. end - begin), storage dtype.
void dequantize_nf4(const Ctx& c, void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end);

}  // namespace mgrl::kernels::cuda
