// residual.cpp: the residual add (in place or out of place) and its identity backward.
#include "kernels/cpu/residual.h"

#include <cstring>

namespace mgrl::kernels::cpu {

void residual_forward(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void residual_add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* dy, const float* dout, int64_t n, bool accumulate) {
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) dy[i] += dout[i];
  } else if (dy != dout && n > 0) {
    std::memcpy(dy, dout, sizeof(float) * static_cast<size_t>(n));
  }
}

}  // namespace mgrl::kernels::cpu
