// attention.cuh: causal grouped-query attention over packed variable-length sequences, forward (saves lse) and
// backward.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/attention_options.h"
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Largest head_dim the kernels take (per-block shared-memory rows).
inline constexpr int kMaxHeadDim = 256;

// Semantics of kernels/cpu/attention.h: sequence b owns token rows cu_seqlens[b] .. cu_seqlens[b+1] - 1 (no padding;
// cu_seqlens [B + 1] int32 on the device, max_len >= every length, known on the host); q, out, dq, dout
// [T, n_heads, head_dim], k, v, dk, dv [T, n_kv, head_dim] in storage dtype; lse [n_heads, T] f32 (lse[h * T + row]).
// Malformed cu_seqlens (see seq_rows) set kErrLength in *c.err (the host reports it at its next sync); the bad
// sequence is treated as empty (its rows are neither read nor written). The backward also takes the forward's
// output `out`. head_dim 64 and 128 run tensor-core kernels where they apply (attention_kernels below), everything
// else the straightforward kernels; all take stream-ordered scratch in the backward (see flash_attention.cuh;
// naive: n_heads * T floats). T == 0 launches nothing.
// opt (kernels/attention_options.h): the tiled and the straightforward kernels take every option; the Volta kernels
// none, so on Volta a call with options runs the straightforward kernels.
void attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                       const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                       int head_dim, const AttentionOptions& opt = {});
void attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                        const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B, int T,
                        int max_len, int n_heads, int n_kv, int head_dim, const AttentionOptions& opt = {});

// The kernels a call runs on the current device, for the storage dtype, head_dim and tensor pointers: kTiled
// (flash_attention.cu, mma.sync: fp16 sm_75+, bf16 sm_80+), kSm70 (flash_attention_sm70.cu, wmma: fp16 sm_70+)
// or kNaive (the straightforward kernels). MGRL_CUDA_ATTENTION=naive forces kNaive, =sm70 puts kSm70 first wherever
// it applies (any GPU of compute capability 7.0+: how tests and benchmarks run the Volta kernels on newer GPUs);
// otherwise kTiled where it applies, then kSm70 (Volta), then kNaive.
enum class AttentionKernels { kTiled, kSm70, kNaive };
AttentionKernels attention_kernels(DType st, int head_dim, std::initializer_list<const void*> tensors);
const char* attention_kernels_name(AttentionKernels k);  // "tiled", "sm70", "naive"

// The straightforward kernels alone (one block per row, no tiling, no tensor cores), any head_dim <= kMaxHeadDim,
// every AttentionOptions: the fallback, and the baseline of perf/bench_attention.
void attention_forward_naive(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                             int head_dim, const AttentionOptions& opt = {});
void attention_backward_naive(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B,
                              int T, int max_len, int n_heads, int n_kv, int head_dim,
                              const AttentionOptions& opt = {});

// The token rows [row0, row0 + len) of sequence b of a packed batch, for every attention kernel. The entry is
// checked where it is read (two loads per block, no separate pass): cu_seqlens[b] >= 0, cu_seqlens[b+1] >=
// cu_seqlens[b], cu_seqlens[b+1] <= T, length <= max_len, cu_seqlens[0] == 0 (b == 0) and cu_seqlens[B] == T
// (b == B - 1). Together over all b these say the sequences tile [0, T) exactly. A failed check sets kErrLength
// (thread 0 of the block) and returns an empty sequence, so no row outside [0, T) is ever touched. Uniform over
// the block (every thread reads the same two entries).
struct SeqRows {
  std::int64_t row0;
  int len;
};
__device__ __forceinline__ SeqRows seq_rows(const std::int32_t* cu_seqlens, int b, int B, int T, int max_len,
                                            int* err) {
  const int start = cu_seqlens[b], end = cu_seqlens[b + 1];
  const bool ok = start >= 0 && end >= start && end <= T && end - start <= max_len && (b != 0 || start == 0) &&
                  (b != B - 1 || end == T);
  if (!ok) {
    if (threadIdx.x == 0) atomicOr(err, kErrLength);
    return {0, 0};
  }
  return {start, end - start};
}

}  // namespace mgrl::kernels::cuda
