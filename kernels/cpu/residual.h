// residual.h: the residual connection, x += y in place or out = a + b, and its (identity) backward.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// x[i] += y[i] for i < n (x is the residual stream, y a block's output).
void residual_forward(float* x, const float* y, int64_t n);

// out[i] = a[i] + b[i] for i < n: the residual add out of place (a block's last residual into the next layer's
// input, without copying the stream first). Bit for bit copy(out, a) then residual_forward(out, b); out may alias a
// or b.
void residual_add(float* out, const float* a, const float* b, int64_t n);

// The backward is the identity: with x_out = x_in + y, dL/dx_in = dL/dx_out (the stream's gradient buffer is
// already right, nothing to do) and dL/dy = dL/dx_out. This copies dout into dy, or adds it when accumulate.
void residual_backward(float* dy, const float* dout, int64_t n, bool accumulate);

}  // namespace mgrl::kernels::cpu
