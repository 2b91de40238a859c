// optimizer.h: AdamW with decoupled weight decay (as torch.optim.AdamW computes it) and the squared norm
// used for gradient clipping.
#pragma once
#include <cstddef>

#include "kernels/ops.h"

namespace mgrl::kernels::cpu {

// sum of x^2 in double.
double sum_squares(const float* x, std::size_t n);

// *acc += scale * sum_i w[i] * x[i] (double, in index order).
void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double scale);

// For each i, with g = grads[i] * grad_scale and t = hp.step:
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
void adamw(float* params, const float* grads, float* m, float* v, std::size_t n, const Ops::AdamW& hp);

}  // namespace mgrl::kernels::cpu
