// lora.h: LoRA adapter on a linear layer, y += scale * (x @ A^T) @ B^T, and its backward.
#pragma once

namespace mgrl::kernels::cpu {

// A is [r, in] (PEFT lora_A), B is [out, r] (PEFT lora_B), scale = lora_alpha / r (or alpha / sqrt(r) for rsLoRA).
//   xa[T, r]   = x[T, in] @ A^T          (written; saved for the backward)
//   y[T, out] += scale * xa @ B^T         (accumulates onto the base layer's output)
// No dropout: x is used as given.
void lora_forward(float* y, float* xa, const float* x, const float* A, const float* B, float scale, int T, int in,
                  int r, int out);

// Given dy[T, out], the forward's x and its saved xa:
//   dB[out, r] += scale * dy^T @ xa
//   dA[r, in]  += (scale * dy @ B)^T @ x
//   dx[T, in]  += (scale * dy @ B) @ A     (adds to the base layer's dx; dx may be null)
// dA and dB always accumulate and may be null. scratch holds T * r floats (scale * dy @ B); when it is null
// the op allocates that buffer itself.
void lora_backward(float* dx, float* dA, float* dB, const float* dy, const float* x, const float* xa, const float* A,
                   const float* B, float scale, int T, int in, int r, int out, float* scratch);

}  // namespace mgrl::kernels::cpu
