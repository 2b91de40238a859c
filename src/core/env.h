// env.h: switches set in the environment, for comparison runs and fallbacks (MGRL_CUDA_GRAPHS, MGRL_LORA_GROUPS,
// MGRL_FUSED_LM_HEAD, MGRL_RADIX_SAMPLER, MGRL_CUBLASLT_BIAS, MGRL_MERGE_LORA, MGRL_FUSED_NORM,
// MGRL_DECODE_FUSED, MGRL_SCORED_ROWS).
#pragma once

namespace mgrl::env {

// A switch that is on by default: false only when the environment variable `name` is exactly "0". Reads the
// environment at each call; callers on a hot path keep the answer.
bool switch_on(const char* name);

}  // namespace mgrl::env
