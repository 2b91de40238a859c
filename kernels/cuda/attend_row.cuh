// attend_row.cuh: the softmax-weighted sum over the keys of one query row, shared by training attention
// (attention.cu) and cached inference attention (kv_cache.cu): pass 1 finds the max score over keys
// first..last, pass 2 sums exp(s - max) and the weighted value rows; out = acc / sum.
#pragma once
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Lane-strided dot product of a shared fp32 row with a storage row, reduced over the warp (all lanes get it).
template <class S>
__device__ __forceinline__ float warp_dot(const float* a, const S* b, int n) {
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
  for (int d = lane; d < n; d += 32) s += a[d] * to_f32(b[d]);
  return warp_sum(s);
}

// Where key u of a row lies: kb + at(u), its value at vb + at(u) (elements).
struct StridedRows {  // rows at a fixed stride (training: packed token rows)
  std::int64_t stride;
  __device__ std::int64_t operator()(int u) const { return u * stride; }
};
struct PagedRows {  // rows of one sequence in a paged KV cache (kernels/ops.h KvPages)
  const std::int32_t* table;  // this sequence's table entries
  int block_size;
  std::int64_t width;  // elements per position (n_kv * head_dim)
  __device__ std::int64_t operator()(int u) const {
    return (static_cast<std::int64_t>(table[u / block_size]) * block_size + u % block_size) * width;
  }
};

// The score of a scaled dot product, soft-capped when softcap > 0 (kernels/attention_options.h).
__device__ __forceinline__ float capped_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// Called by every thread of a block of kWarps full warps, after qs (shared, the query row in fp32) is filled
// and the block synchronised. Each warp takes every kWarps-th key u of first..last (key u at kb + at(u), its value
// at vb + at(u)); acc (shared, [kWarps][kMaxHeadDim]) and red (shared, [kWarps]) are scratch. first > 0 for a
// sliding window; softcap > 0 soft-caps the scores.
// Writes o[0..hd) and returns the row's logsumexp of the (capped) scaled scores (the same value in every thread).
template <class S, int kWarps, class RowAt>
__device__ float attend_row(S* o, const float* qs, float (*acc)[kMaxHeadDim], float* red, const S* kb, const S* vb,
                            RowAt at, int first, int last, int hd, float scale, float softcap) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = lane; d < hd; d += 32) acc[warp][d] = 0.0f;  // each lane touches only its own entries

  // Pass 1: the max of s_u = cap(scale * q . k_u).
  float m = -INFINITY;
  for (int u = first + warp; u <= last; u += kWarps)
    m = fmaxf(m, capped_score(scale * warp_dot(qs, kb + at(u), hd), softcap));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  float mx = red[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, red[w]);  // finite: warp 0 always has key u = first
  __syncthreads();                                          // red is written again below

  // Pass 2: l = sum_u exp(s_u - mx), acc = sum_u exp(s_u - mx) v_u (per warp).
  float l = 0.0f;
  for (int u = first + warp; u <= last; u += kWarps) {
    const float p = expf(capped_score(scale * warp_dot(qs, kb + at(u), hd), softcap) - mx);
    l += p;
    const S* vu = vb + at(u);
    for (int d = lane; d < hd; d += 32) acc[warp][d] += p * to_f32(vu[d]);
  }
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += red[w];
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) a += acc[w][d];
    o[d] = from_f32<S>(a * inv);
  }
  return mx + logf(sum);
}

}  // namespace mgrl::kernels::cuda
