// sampling.cuh: choosing the next token from logits on the GPU, by the canonical algorithm of kernels/cpu/sampling.h.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

// tokens[b], logprobs[b] for each row b of logits [B, V] (f32); row b's uniform is random_uniform(seeds[b], 0).
// tokens, logprobs, logits, seeds are device pointers. One block per row; no scratch, no host synchronisation.
void sample(const Ctx& c, std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B,
            int V, const Ops::Sampling& params);

}  // namespace mgrl::kernels::cuda
