// optimizer.cpp: AdamW and the squared norm on the host.
#include "kernels/cpu/optimizer.h"

#include <cmath>

namespace mgrl::kernels::cpu {

double sum_squares(const float* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double scale) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(w[i]) * x[i];
  *acc += scale * s;
}

void adamw(float* params, const float* grads, float* m, float* v, std::size_t n, const Ops::AdamW& hp) {
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.step));
  const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.step));
  const float step_size = hp.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grads[i] * hp.grad_scale;
    params[i] *= decay;
    m[i] = hp.beta1 * m[i] + (1.0f - hp.beta1) * g;
    v[i] = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
    params[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + hp.eps);
  }
}

}  // namespace mgrl::kernels::cpu
