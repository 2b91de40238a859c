// embedding.cuh: token embedding lookup (gather rows of a [V, D] table) and its backward (f32 scatter-add).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/embedding.h. An id >= V cannot throw on the device: it gives a zero row (forward) or
// is skipped (backward) and sets kErrTokenId in *c.err, which the host turns into a FatalError at its next sync.
// scale != 1 (Gemma) is rounded to the storage dtype, and each row is multiplied by it in fp32 and rounded, as
// transformers multiplies the embedding by a scale tensor of the weights' dtype; the backward scales by it too.
void embedding_forward(const Ctx& c, void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                       float scale = 1.0f);
void embedding_backward(const Ctx& c, float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D,
                        float scale = 1.0f);

}  // namespace mgrl::kernels::cuda
