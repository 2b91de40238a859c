// embedding.cpp: token embedding lookup and its scatter-add backward.
#include "kernels/cpu/embedding.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace mgrl::kernels::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* table, int T, int V, int D, float scale) {
  for (int t = 0; t < T; ++t) {
    const int32_t id = ids[t];
    float* o = out + static_cast<int64_t>(t) * D;
    if (id < 0) {
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(D));
      continue;
    }
    MGRL_CHECK(id < V, "token id " + std::to_string(id) + " out of range (vocab " + std::to_string(V) + ")");
    std::memcpy(o, table + static_cast<int64_t>(id) * D, sizeof(float) * static_cast<size_t>(D));
    if (scale != 1.0f)
      for (int i = 0; i < D; ++i) o[i] *= scale;
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int T, int V, int D, float scale) {
  for (int t = 0; t < T; ++t) {
    const int32_t id = ids[t];
    if (id < 0) continue;
    MGRL_CHECK(id < V, "token id " + std::to_string(id) + " out of range (vocab " + std::to_string(V) + ")");
    float* g = dtable + static_cast<int64_t>(id) * D;
    const float* d = dout + static_cast<int64_t>(t) * D;
    for (int i = 0; i < D; ++i) g[i] += scale * d[i];
  }
}

}  // namespace mgrl::kernels::cpu
