// rmsnorm.cpp: RMSNorm forward (saves per-row rstd), the residual add fused before it, and the backward (dx,
// accumulated dw).
#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <cstdint>

namespace mgrl::kernels::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int rows, int dim, float eps,
                     bool unit_offset) {
  const float off = unit_offset ? 1.0f : 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* o = out + static_cast<int64_t>(r) * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / dim + static_cast<double>(eps)));
    rstd[r] = s;
    for (int i = 0; i < dim; ++i) o[i] = (xr[i] * s) * (w[i] + off);
  }
}

void residual_rmsnorm_forward(float* x_out, float* h, float* rstd, const float* x_in, const float* y, const float* w,
                              int rows, int dim, float eps, bool unit_offset) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t o = static_cast<std::int64_t>(r) * dim;
    for (int i = 0; i < dim; ++i) x_out[o + i] = x_in[o + i] + y[o + i];
    rmsnorm_forward(h + o, rstd + r, x_out + o, w, 1, dim, eps, unit_offset);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int rows, int dim, bool accumulate, bool unit_offset) {
  const float off = unit_offset ? 1.0f : 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    const float* g = dout + static_cast<int64_t>(r) * dim;
    const float s = rstd[r];
    if (dw) {
      for (int i = 0; i < dim; ++i) dw[i] += g[i] * xr[i] * s;
    }
    if (!dx) continue;
    double dot = 0.0;  // sum(dout * w * x)
    for (int i = 0; i < dim; ++i) dot += static_cast<double>(g[i]) * (w[i] + off) * xr[i];
    const float c = static_cast<float>(dot * s * s * s / dim);
    float* d = dx + static_cast<int64_t>(r) * dim;
    for (int i = 0; i < dim; ++i) {
      const float v = s * g[i] * (w[i] + off) - c * xr[i];
      d[i] = accumulate ? d[i] + v : v;
    }
  }
}

}  // namespace mgrl::kernels::cpu
