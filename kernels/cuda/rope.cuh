// rope.cuh: rotary position embedding (HF rotate-half), in place, forward (rotation by +angle) and backward (-angle).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Semantics of kernels/cpu/rope.h: x [T, n_heads, head_dim] in storage dtype, pos [T] int32, inv_freq
// [head_dim / 2] f32 (device memory). head_dim must be even.
void rope_forward(const Ctx& c, void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                  int head_dim);
void rope_backward(const Ctx& c, void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                   int head_dim);

// Pair (j, j + half) of one head row v at position p, rotated in place (sign -1: the backward). The arithmetic of
// every RoPE kernel (rope.cu, the fused RoPE + KV store of kv_cache.cu), in one place so that they give the same
// bits: the angle a = p * inv_freq[j] is the fp32 product (as in transformers), cos/sin are the accurate
// sinf/cosf (the build does not use --use_fast_math); then
//   v[j] <- v[j] cos - v[j + half] sin,   v[j + half] <- v[j + half] cos + v[j] sin.
template <class S>
__device__ __forceinline__ void rope_rotate_pair(S* v, int j, int half, int p, const float* inv_freq, float sign) {
  const float a = static_cast<float>(p) * inv_freq[j];
  const float cs = cosf(a);
  const float sn = sign * sinf(a);
  const float x0 = to_f32(v[j]), x1 = to_f32(v[j + half]);
  v[j] = from_f32<S>(x0 * cs - x1 * sn);
  v[j + half] = from_f32<S>(x1 * cs + x0 * sn);
}

}  // namespace mgrl::kernels::cuda
