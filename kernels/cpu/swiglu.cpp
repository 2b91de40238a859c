// swiglu.cpp: SwiGLU and GeGLU (tanh GELU) forward and backward, elementwise.
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

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void geglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kGeluC * (g + kGeluA * g * g * g))) * up[i];
  }
}

void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float t = std::tanh(kGeluC * (g + kGeluA * g * g * g));
    const float gelu = 0.5f * g * (1.0f + t);
    const float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * g * g);
    dgate[i] = d * u * dgelu;
    dup[i] = d * gelu;
  }
}

}  // namespace mgrl::kernels::cpu
