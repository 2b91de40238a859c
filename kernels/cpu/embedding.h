// embedding.h: token embedding lookup (gather rows of a [V, D] table) and its backward (scatter-add).
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// out[t, :] = table[ids[t], :] for t < T. An id < 0 (padding) gives a row of zeros;
// an id >= V is a FatalError. scale != 1 (Gemma: sqrt(hidden_size)) multiplies every row.
void embedding_forward(float* out, const int32_t* ids, const float* table, int T, int V, int D, float scale = 1.0f);

// dtable[ids[t], :] += scale * dout[t, :] (accumulates; rows with the same id add up). Ids < 0 are skipped.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int T, int V, int D, float scale = 1.0f);

}  // namespace mgrl::kernels::cpu
