// embedding.cuh: token embedding lookup (gather rows of a [V, D] table) and its backward (f32 scatter-add).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/embedding.h. An id >= V cannot throw on the device: it gives a zero row (forward) or
// is skipped (backward) and sets kErrTokenId in *c.err, which the host turns into a FatalError at its next sync.
void embedding_forward(const Ctx& c, void* out, const std::int32_t* ids, const void* table, int T, int V, int D);
void embedding_backward(const Ctx& c, float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D);

}  // namespace mgrl::kernels::cuda
