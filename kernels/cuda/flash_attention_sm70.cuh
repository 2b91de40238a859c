// flash_attention_sm70.cuh: tiled (FlashAttention-2-style) causal GQA attention over packed variable-length
// sequences on Volta's tensor cores (nvcuda::wmma fp16 m16n16k16, fp32 accumulation) for head_dim 64 and 128.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Whether MGRL_CUDA_ATTENTION is "sm70": attention.cu then prefers these kernels wherever they apply (any GPU of
// compute capability 7.0 or newer), so that tests and perf/bench_attention run them on the GPUs at hand.
bool flash_attention_sm70_forced();

// Whether these kernels take a call: fp16 storage; head_dim 64 or 128; compute capability 7.0 or newer; enough
// shared memory per block for the tiles (opt-in; hd 64: 47.25 KB, hd 128: 71.25 KB); every tensor pointer 16-byte
// aligned; and MGRL_CUDA_ATTENTION not "naive".
bool flash_attention_sm70_applies(DType st, int head_dim, std::initializer_list<const void*> tensors);

// Same semantics, arguments, scratch and determinism as flash_attention_forward / flash_attention_backward
// (flash_attention.cuh; lse and D [n_heads, T]); shapes already checked by attention.cu and
// flash_attention_sm70_applies true. Grids (B * n_heads, ceil(max_len / 64)).
void flash_attention_sm70_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                                  const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                                  int head_dim);
void flash_attention_sm70_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out,
                                   const void* q, const void* k, const void* v, const float* lse,
                                   const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                                   int head_dim);

}  // namespace mgrl::kernels::cuda
