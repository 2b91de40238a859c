// sampling.h: choosing the next token from logits, the canonical algorithm every backend follows.
//
// For one row of logits z[0..V) and a uniform u in [0, 1):
//   temperature 0: the argmax (lowest index on ties); otherwise
//   1. z = z / temperature
//   2. top_k > 0: keep tokens with z >= the k-th largest z (ties at the boundary are all kept)
//   3. p = softmax of the kept z
//   4. top_p < 1: keep tokens with p >= tau, tau the largest value such that the kept mass is >= top_p
//      (the smallest set of most likely tokens whose mass reaches top_p; ties at the boundary are kept)
//   5. min_p > 0: keep tokens with p >= min_p * max(p)
//   6. the token: the smallest index i whose cumulative kept mass (in index order) exceeds u * total kept mass
// The recorded log-prob is log_softmax(z_original)[token] (temperature 1, no filtering).
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace mgrl::kernels::cpu {

// tokens[b], logprobs[b] for each row b of logits [B, V]; row b's uniform is random_uniform(seeds[b], 0).
void sample(int32_t* tokens, float* logprobs, const float* logits, const uint64_t* seeds, int B, int V,
            const Ops::Sampling& params);

// Ops::repetition_penalty, Ops::mark_seen, Ops::token_logprobs (kernels/ops.h).
void repetition_penalty(float* out, const float* logits, const uint8_t* seen, const int32_t* seen_row, int R, int V,
                        float penalty);
void mark_seen(uint8_t* seen, const int32_t* seen_row, const int32_t* tokens, int R, int V);
void token_logprobs(float* logprobs, const float* logits, const int32_t* tokens, int R, int V);

// Ops::decode_advance: one decode step's bookkeeping (next inputs, EOS and length, next seeds, the token ring).
void decode_advance(int32_t* ids, int32_t* pos, int32_t* count, int32_t* done, uint64_t* seeds, int32_t* ring_tokens,
                    float* ring_logprobs, const int32_t* tokens, const float* logprobs, const uint64_t* streams,
                    const int32_t* eos, int n_eos, int max_count, int R);

}  // namespace mgrl::kernels::cpu
