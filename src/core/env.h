// env.h: switches set in the environment, for comparison runs and fallbacks (MGRL_CUDA_GRAPHS, MGRL_LORA_GROUPS,
// MGRL_FUSED_LM_HEAD, MGRL_RADIX_SAMPLER, MGRL_CUBLASLT_BIAS, MGRL_MERGE_LORA, MGRL_FUSED_NORM,
// MGRL_DECODE_FUSED, MGRL_SCORED_ROWS; opt-in: MGRL_SAMPLER_SPLIT, MGRL_PDL,
// MGRL_DECODE_NORM_FOLD, MGRL_GATE_UP_STACKED, MGRL_LORA_CONCAT, MGRL_SELF_COMM).
#pragma once

namespace mgrl::env {

// A switch that is on by default: false only when the environment variable `name` is exactly "0". Reads the
// environment at each call; callers on a hot path keep the answer.
bool switch_on(const char* name);
// switch_on(name), and when it is off one info line (`when_off`) in the log: for switches read once per process.
bool switch_on_logged(const char* name, const char* when_off);
// A path that is off by default (not yet measured): true only when the environment variable `name` is exactly "1".
bool opt_in(const char* name);
// opt_in(name), and when it is on one info line (`when_on`) in the log: for paths read once per process, so that a
// run's log says which unmeasured path it took.
bool opt_in_logged(const char* name, const char* when_on);

}  // namespace mgrl::env
