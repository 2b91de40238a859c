#!/usr/bin/env bash
# ppo_shard_base.sh: `mgrl ppo` on a sharded base (model.shard_base) trains what the unsharded run trains, bit for bit,
# at 1, 2 and 4 ranks: LoRA weights and AdamW moments, the value head's state, the rollout files (tokens, log-probs,
# values, returns, advantages) and every logged figure of an update (losses, scores, rewards, KL, ratios, held-out).
#   ppo_shard_base.sh WORK CHECK_TRAIN "RUNN" "MPI_FLAGS" MODEL_DIR HELDOUT -- MGRL ARGS...
# RUNN: the launcher and its rank-count flag ("mpiexec -n"); MODEL_DIR: the pretrained fixture whose config.json is
# given 5 layers (model.num_layers) for the 2- and 4-rank runs (random weights: layers that do not divide evenly over the ranks);
# HELDOUT: a JSONL whose first 3 lines are the held-out prompts (2 ranks hold 1 and 2 of them, 4 ranks 0, 1, 1, 1:
# a rank without any still steps with the others). 4 ranks keep the gathered layers (model.shard_base_keep); 2 ranks
# also over an NF4 (QLoRA) base quantized at load.
set -euo pipefail
work=$1 check=$2 runn=$3 flags=$4 model=$5 heldout=$6
shift 6
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
head -n 3 "$heldout" > "$work/eval3.jsonl"

# keys of metrics.jsonl that must agree exactly in every logged step
keys="loss grad_norm lr objective/scores objective/kl objective/entropy objective/non_score_reward objective/rlhf_reward
      objective/kl_coef rewards/correct/mean rewards/digit_first/mean loss/policy_avg loss/value_avg policy/approxkl_avg
      policy/clipfrac_avg val/clipfrac_avg val/ratio val/ratio_var val/num_eos_tokens completions/mean_length
      eval_reward eval_accuracy"
datasets="completion_tokens completion_lengths logprobs ref_logprobs values returns token_advantages reward"

compare() {  # compare DIR_A DIR_B STEP: the two runs' final checkpoints, rollout files and metrics
  local a=$1 b=$2 step=$3
  local ck
  ck=$(printf 'step_%08d.h5' "$step")
  "$check" weights "$a/$ck" "$b/$ck" --exact
  # the value head (parameters and AdamW moments) and the KL coefficient: the checkpoint's JSON state
  h5dump -d /state/extra "$a/$ck" | tail -n +3 > "$work/extra_a"
  h5dump -d /state/extra "$b/$ck" | tail -n +3 > "$work/extra_b"
  grep -q value_head "$work/extra_a"
  cmp "$work/extra_a" "$work/extra_b" && echo "value head state equal"
  local n=0
  for f in "$a"/rollouts/step_*.h5; do
    for d in $datasets; do h5diff "$f" "$b/rollouts/$(basename "$f")" "/$d" "/$d"; done
    n=$((n + 1))
  done
  [ "$n" -ge 2 ] && echo "$n rollout files equal"
  local m=0
  for k in $keys; do
    if grep -q "\"$k\"" "$a/metrics.jsonl"; then
      "$check" losses "$a/metrics.jsonl" "$b/metrics.jsonl" --key="$k"
      m=$((m + 1))
    fi
  done
  [ "$m" -ge 20 ] && echo "$m metrics equal"
}

run() {  # run RANKS NAME ARGS...: one training run of 8 optimizer steps (two rollout batches)
  local n=$1 name=$2
  shift 2
  mkdir -p "$work/$name"
  # shellcheck disable=SC2086
  $runn "$n" $flags "$@" --train.max_steps=8 --checkpoint.dir="$work/$name" --log.dir="$work/$name" \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}

run 1 np1/plain "$@"
run 1 np1/shard "$@" --model.shard_base=true
grep -E '^step 8/8 .* base [0-9.]+ MiB/rank' "$work/np1/shard.log"
compare "$work/np1/plain" "$work/np1/shard" 8
# One sequence in flight and prompts prefilled 3 tokens a step: each rank's generation takes as many steps as its
# prompts' lengths and its responses' (EOS ends some early) make, unequal over the ranks, so lockstep is exercised.
random=(--model.path="$model" --model.num_layers=5 --model.init=random --eval.input="$work/eval3.jsonl" --eval.every_steps=4
        --generate.max_sequences=1 --generate.max_prefill_tokens=3 --ppo.response_length=12)
run 2 np2/plain "$@" "${random[@]}"
run 2 np2/shard "$@" "${random[@]}" --model.shard_base=true
grep -E '^step 8/8 .* base [0-9.]+ MiB/rank' "$work/np2/shard.log"
compare "$work/np2/plain" "$work/np2/shard" 8
run 4 np4/plain "$@" "${random[@]}" --model.shard_base_keep=true
run 4 np4/shard "$@" "${random[@]}" --model.shard_base_keep=true --model.shard_base=true
grep -E '^step 8/8 .* base [0-9.]+ MiB/rank' "$work/np4/shard.log"
grep -c '^eval ' "$work/np4/shard.log" | grep -qx 3
compare "$work/np4/plain" "$work/np4/shard" 8
# A QLoRA base (quantized at load, double-quantized): a rank stores and gathers its part of the layers' NF4 bytes.
qlora=(--model.quantize=nf4 --model.quantize_double=true)
run 2 np2q/plain "$@" "${random[@]}" "${qlora[@]}"
run 2 np2q/shard "$@" "${random[@]}" "${qlora[@]}" --model.shard_base=true
grep -E '^step 8/8 .* base [0-9.]+ MiB/rank' "$work/np2q/shard.log"
compare "$work/np2q/plain" "$work/np2q/shard" 8
echo "ppo on a sharded base equals the unsharded run on 1, 2 and 4 ranks, and on 2 over a QLoRA base"
