#!/usr/bin/env bash
# decode_fused.sh: greedy generation with the fused inference ops (the default) against MGRL_DECODE_FUSED=0 (RoPE,
# KV store, projections and their epilogues as separate ops) on the CPU backend, where the fused ops are their
# composition: the same bits by construction, so this checks that the switch reaches mgrl and that the fused path
# runs end to end (prefill and recorded decode steps), not the CUDA kernels (tests/gpu/test_model_cuda.cpp does).
#   decode_fused.sh WORK MGRL MODELS TOKENIZER PROMPTS
# Cases: llama_gqa with its adapter unmerged (the adapters run beside the fused q|k|v group) and merged (everything
# fused), qwen2_bias_tied (q/k/v biases) and gemma3_text (GeGLU, post-norms) without an adapter.
# Asserts: the same generated lines (tokens, text, log-probs) with the switch on and off; the runs with the switch off
# say so on their output, the others do not.
set -euo pipefail
[ $# = 5 ] || { echo "usage: decode_fused.sh WORK MGRL MODELS TOKENIZER PROMPTS"; exit 2; }
work=$1 mgrl=$2 models=$3 tok=$4 prompts=$5
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run NAME FUSED ARGS...: one greedy generation into $work/NAME.FUSED.jsonl
  local name=$1 fused=$2 env=(env)
  shift 2
  [ "$fused" = 0 ] && env=(env MGRL_DECODE_FUSED=0)
  "${env[@]}" "$mgrl" generate --runtime.backend=cpu --model.tokenizer="$tok" --data.input="$prompts" \
    --generate.max_new_tokens=6 --generate.num_generations=2 --generate.temperature=0 \
    --generate.output="$work/$name.$fused.jsonl" "$@" > "$work/$name.$fused.log" 2>&1 ||
    fail "$name.$fused: exit $? ($(tail -n 3 "$work/$name.$fused.log"))"
  if [ "$fused" = 0 ]; then
    grep -q 'MGRL_DECODE_FUSED=0: ' "$work/$name.$fused.log" || fail "$name.$fused: the switch did not reach mgrl"
  else
    ! grep -q 'MGRL_DECODE_FUSED' "$work/$name.$fused.log" || fail "$name.$fused: the fused run reports the switch"
  fi
}
check() {  # check NAME ARGS...
  local name=$1
  shift
  run "$name" 1 "$@"
  run "$name" 0 "$@"
  [ -s "$work/$name.1.jsonl" ] || fail "$name: no output"
  cmp "$work/$name.1.jsonl" "$work/$name.0.jsonl" || fail "$name: the greedy completions differ"
}
check llama_unmerged --model.path="$models/llama_gqa" --lora.adapter="$models/llama_gqa" --generate.merge_lora=off
check llama_merged --model.path="$models/llama_gqa" --lora.adapter="$models/llama_gqa" --generate.merge_lora=on
check qwen2_bias --model.path="$models/qwen2_bias_tied"
check gemma3 --model.path="$models/gemma3_text"
echo "PASS: fused inference ops = MGRL_DECODE_FUSED=0 on the CPU backend (greedy generation, 4 models/adapters)"
