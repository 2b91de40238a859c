// swiglu.cpp: SwiGLU forward and backward, elementwise.
#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace mgrl::kernels::cpu {

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    out[i] = g * sig * up[i];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
    dup[i] = d * silu;
  }
}

}  // namespace mgrl::kernels::cpu
