// lm_head.cuh: the output layer fused with log-softmax, in chunks of rows (cuBLAS GEMM into fp32 scratch, then a
// row kernel for logsumexp and the target's log-prob), its backward, and full logits.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mgrl::kernels::cuda {

// Rows of logits held at a time for a vocabulary of V: 128 to 1024, within 1 GiB of scratch.
int lm_head_chunk_rows(int V);

// Scratch the logprob ops need: fp32 logits [lm_head_chunk_rows(V), V], then (256-byte aligned) the storage-dtype
// dlogits [lm_head_chunk_rows(V), V] of the backward.
std::size_t lm_head_scratch_bytes(DType st, int V);

// Semantics of kernels/cpu/lm_head.h: h [T, D] and W [V, D] in storage dtype; logprob, lse, weights [T] and dW
// [V, D] f32; dh [T, D] storage. scratch: lm_head_scratch_bytes(st, V) bytes of device memory, or null (then the
// op takes stream-ordered scratch itself). A target >= V is treated as ignored and sets kErrTargetId in *c.err.
// softcap > 0: logits = logit_scale * softcap * tanh(h W^T / softcap) (Gemma 2), applied in fp32 to the chunk.
// stats [4T] f32 (optional): the rows' entropies, their top-1 hits, mean logits and log sum p^2 (kernels/cpu/lm_head.h),
// from the same online pass over each row (running sums of exp(l - max) * l, of exp(2 (l - max)) and of l, and the
// first maximum's index, beside lse's).
void lm_head_logprob_forward(const Ctx& c, float* logprob, float* lse, const void* h, const void* W,
                             const std::int32_t* targets, int T, int D, int V, float logit_scale, void* scratch,
                             float softcap = 0.0f, float* stats = nullptr);
void lm_head_logprob_backward(const Ctx& c, void* dh, float* dW, const float* weights, const void* h, const void* W,
                              const std::int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                              void* scratch, float softcap = 0.0f, const float* entropy_weights = nullptr,
                              const float* entropy = nullptr);
// Both in one pass (SFT: the loss weights are known before the forward): per chunk, the forward's GEMM and row
// kernel, then the backward's dlogits kernel and GEMMs on the same fp32 logits, which the backward alone would
// compute again. The same launches in the same order as the forward then the backward (no new kernel): outputs equal
// theirs. Same scratch as either op.
void lm_head_logprob_forward_backward(const Ctx& c, float* logprob, float* lse, void* dh, float* dW,
                                      const float* weights, const void* h, const void* W, const std::int32_t* targets,
                                      int T, int D, int V, float logit_scale, void* scratch, float softcap = 0.0f,
                                      float* stats = nullptr);
// Knowledge distillation's divergence fused with the student's LM head and its backward: semantics of
// kernels/cpu/lm_head.h lm_head_divergence (div, entropy, weights [T] and dW [V, D] f32; h, W, th, tW, dh in storage
// dtype); the op takes stream-ordered scratch itself.
void lm_head_divergence(const Ctx& c, float* div, float* entropy, void* dh, float* dW, const float* weights,
                        const void* h, const void* W, int T, int D, int V, float logit_scale, float softcap,
                        const void* th, const void* tW, int Dt, float t_logit_scale, float t_softcap, float beta);
// logits [T, V] f32 = logit_scale * h @ W^T, in one GEMM (then the soft-cap, when there is one).
void lm_head_logits(const Ctx& c, float* logits, const void* h, const void* W, int T, int D, int V,
                    float logit_scale, float softcap = 0.0f);

}  // namespace mgrl::kernels::cuda
