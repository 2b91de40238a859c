// sampling.cuh: choosing the next token from logits on the GPU, by the canonical algorithm of kernels/cpu/sampling.h.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// tokens[b], logprobs[b] for each row b of logits [B, V] (f32); row b's uniform is random_uniform(seeds[b], 0).
// tokens, logprobs, logits, seeds are device pointers. One block per row and no scratch (with MGRL_SAMPLER_SPLIT=1,
// greedy and unfiltered rows in chunks with stream-ordered scratch); no host synchronisation either way.
void sample(const Ctx& c, std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B,
            int V, const Ops::Sampling& params);

// Ops::repetition_penalty, Ops::mark_seen, Ops::token_logprobs (kernels/ops.h), device pointers, no host
// synchronisation (token_logprobs: one block per row, its sums in double in another order than the CPU's).
void repetition_penalty(const Ctx& c, float* out, const float* logits, const std::uint8_t* seen,
                        const std::int32_t* seen_row, int R, int V, float penalty);
void mark_seen(const Ctx& c, std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R,
               int V);
void token_logprobs(const Ctx& c, float* logprobs, const float* logits, const std::int32_t* tokens, int R, int V);

// Ops::decode_advance (kernels/ops.h): one thread per row, every pointer a device pointer; no host synchronisation,
// so it may be part of a recording.
void decode_advance(const Ctx& c, std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                    std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs, const std::int32_t* tokens,
                    const float* logprobs, const std::uint64_t* streams, const std::int32_t* eos, int n_eos,
                    int max_count, int R);

}  // namespace mgrl::kernels::cuda
