// flash_attention.cuh: tiled (FlashAttention-2-style) causal GQA attention over packed variable-length sequences on
// tensor cores for head_dim 64 and 128.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/attention_options.h"
#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Whether the tiled kernels take a call: head_dim 64 or 128; a GPU with ldmatrix/mma.sync for the storage type
// (fp16: sm_75+, bf16: sm_80+), running code compiled for such an architecture (not compute_70 PTX JIT-compiled),
// and enough shared memory per block for the tiles; every tensor pointer 16-byte aligned; and the environment variable MGRL_CUDA_ATTENTION not set to "naive". Otherwise attention.cu runs the
// Volta kernels (flash_attention_sm70.cuh) where they apply, else its straightforward kernels
// (attention_kernels in attention.cuh; MGRL_CUDA_ATTENTION=sm70 puts the Volta kernels first).
bool flash_attention_applies(DType st, int head_dim, std::initializer_list<const void*> tensors);

// Same semantics and arguments as attention_forward / attention_backward (attention.cuh: packed sequences,
// cu_seqlens [B + 1] on the device, lse [n_heads, T]); shapes already checked (T <= B * max_len, grids in range) and
// flash_attention_applies true. The backward also takes the forward's output `out` (for D = rowsum(dout * out)).
// Grids: (B * n_heads, ceil(max_len / 64)). Scratch (stream-ordered): n_heads * T floats (D), plus
// 2 * T * n_heads * head_dim floats when n_heads > n_kv (per-head dk/dv partials [T, n_heads, head_dim], summed over
// each group in a fixed order: deterministic). opt: score scale, sliding window and soft-capping
// (kernels/attention_options.h).
void flash_attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                             int head_dim, const AttentionOptions& opt = {});
void flash_attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out,
                              const void* q, const void* k, const void* v, const float* lse,
                              const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                              int head_dim, const AttentionOptions& opt = {});

// The backward's two helper kernels, shared with the Volta kernels (flash_attention_sm70.cu): Dsum [n_heads, T] =
// rowsum(dout * out) over every token row (head_dim even); and dk/dv [T, n_kv, head_dim] = the fp32 partials
// [T, n_heads, head_dim] summed over each group's query heads in head order (head_dim % 4 == 0), or zeros without
// reading the partials when *c.err holds kErrLength (a rejected sequence's rows have none). T > 0.
void flash_attention_dsum(const Ctx& c, float* Dsum, const void* dout, const void* out, int T, int n_heads,
                          int head_dim);
void flash_attention_reduce_kv(const Ctx& c, void* dk, void* dv, const float* part_k, const float* part_v, int T,
                               int n_kv, int group, int head_dim);

}  // namespace mgrl::kernels::cuda
