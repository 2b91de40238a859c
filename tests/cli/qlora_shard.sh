#!/usr/bin/env bash
# qlora_shard.sh: model.shard_base over an NF4 (QLoRA) base changes no bit. For one mode it runs the unsharded and the
# sharded run of the same configuration at 1, 2 and 4 ranks (dpo: 1 and 2) and compares what they write: sft, grpo
# and dpo the LoRA weights and AdamW moments (bitwise) and every logged loss and grad norm (GRPO's rewards and KL,
# held-out losses and rewards where evaluated), generate its output file byte for byte, score its log-probs (h5diff).
# The cases: the bitsandbytes 4-bit directories (tests/data/nf4/llama_nf4, double-quantized absmax, and
# llama_nf4_plain, fp32 absmax), their bf16 source quantized at load without double quantization, and (sft, grpo) a
# 5-layer random-weight model quantized at load with it, so that both gather slots are reused and prefetched into.
# The 2-rank sft case also holds the bytes each rank stores and gathers (the step line's base_bytes_per_rank,
# gather_workspace_bytes) against `mgrl plan`'s count: NF4 bytes, not dense ones.
# usage: qlora_shard.sh MODE MGRL CHECK_TRAIN SOURCE_DIR WORK_DIR     (MODE: sft, grpo, dpo, generate, score)
#        environment: MPIRUN (e.g. "mpiexec -n"), MPIFLAGS (flags after the rank count)
set -eu
mode=$1 mgrl=$2 check=$3 src=$4 work=$5
: "${MPIRUN:?MPIRUN names the MPI launcher and its rank-count flag}"
mpiflags=${MPIFLAGS:-}
nf4=$src/tests/data/nf4
rm -rf "$work"
mkdir -p "$work"
run() {  # run NP ARGS...: mgrl on NP ranks
  local np=$1
  shift
  # shellcheck disable=SC2086  # MPIRUN and MPIFLAGS are words
  $MPIRUN "$np" $mpiflags "$mgrl" "$@"
}
bnb=(--model.path="$nf4/llama_nf4")
bnb_plain=(--model.path="$nf4/llama_nf4_plain")
at_load=(--model.path="$nf4/llama_dense" --model.quantize=nf4 --model.quantize_double=false)
random5=(--model.path="$nf4/llama_dense" --model.init=random --model.num_layers=5 --model.quantize=nf4
         --model.quantize_double=true)
head -n 13 "$src/tests/data/sft/heldout.jsonl" > "$work/eval13.jsonl"
head -n 5 "$src/tests/data/sft/heldout.jsonl" > "$work/eval5.jsonl"

# same_training NAME NP ARGS...: the unsharded and the sharded run of ARGS on NP ranks train the same weights and log
# the same numbers.
same_training() {
  local name=$1 np=$2
  shift 2
  local a=$work/$name/plain b=$work/$name/shard
  run "$np" "$@" --checkpoint.dir="$a" --log.dir="$a" > "$work/$name.plain.out"
  run "$np" "$@" --model.shard_base=true --checkpoint.dir="$b" --log.dir="$b" > "$work/$name.shard.out"
  if ! grep -q "base [0-9.]* MiB/rank" "$work/$name.shard.out"; then
    cat "$work/$name.shard.out"
    echo "FAIL: $name: no base share in the step line"
    exit 1
  fi
  local last
  last=$(cd "$a" && ls step_*.h5 | tail -n 1)
  "$check" weights "$a/$last" "$b/$last" --exact
  local keys=(loss grad_norm)
  [ "$mode" = grpo ] && keys+=(reward kl)
  grep -q '"eval_loss"' "$a/metrics.jsonl" && keys+=(eval_loss)
  grep -q '"eval_reward"' "$a/metrics.jsonl" && keys+=(eval_reward)
  for k in "${keys[@]}"; do "$check" losses "$a/metrics.jsonl" "$b/metrics.jsonl" --key="$k"; done
  echo "$name: $np ranks, sharded equals unsharded (${keys[*]})"
}

# field FILE KEY: the value of KEY in the last record of metrics FILE that has it.
field() { "$check" field "$1" "$2" | awk '{ print $NF }'; }
# plan_part JSON NAME: the bytes of the plan's part NAME.
plan_part() {
  printf '%s' "$1" | sed 's/},{/}\n{/g' | grep "\"name\":\"$2\"" | grep -o '"bytes":[0-9.e+]*' | cut -d: -f2
}

case $mode in
  sft)
    common=(sft --runtime.backend=cpu --model.tokenizer="$src/inputs/quickstart"
            --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=8 --train.lr=5e-3 --lora.r=4
            --lora.alpha=8 --checkpoint.resume=none --train.max_steps=3)
    same_training sft_np1_bnb 1 "${common[@]}" "${bnb[@]}"
    same_training sft_np2_at_load 2 "${common[@]}" "${at_load[@]}" --model.recompute=true --model.shard_base_keep=true
    same_training sft_np2_bnb_plain 2 "${common[@]}" "${bnb_plain[@]}"
    same_training sft_np4_bnb 4 "${common[@]}" "${bnb[@]}" --eval.every_steps=2 --eval.input="$work/eval13.jsonl" \
                  --eval.batch_size=3
    same_training sft_np4_random5 4 "${common[@]}" "${random5[@]}" --lora.dropout=0.1
    # What a rank of the 2-rank run holds and gathers, against the plan of that run (CPU target, 2 ranks; the
    # workspace: every layer, as shard_base_keep keeps them).
    m=$work/sft_np2_at_load/shard/metrics.jsonl
    held=$(field "$m" base_bytes_per_rank)
    gathered=$(field "$m" gather_workspace_bytes)
    plan=$("$mgrl" plan "${common[@]:1}" "${at_load[@]}" --model.recompute=true --model.shard_base=true \
           --model.shard_base_keep=true --plan.target=cpu --gpus 2 --json)
    plan_held=$(plan_part "$plan" "base weights")
    plan_gathered=$(plan_part "$plan" "gather workspace")
    awk -v h="$held" -v g="$gathered" -v ph="$plan_held" -v pg="$plan_gathered" 'BEGIN {
      printf "2 ranks: base held %d bytes (plan %.0f), gather workspace %d bytes (plan %.0f)\n", h, ph, g, pg;
      bad = h <= 0 || g <= 0 || (h - ph) / ph > 0.01 || (ph - h) / ph > 0.01 ||
            (g - pg) / pg > 0.01 || (pg - g) / pg > 0.01;
      exit bad ? 1 : 0 }' || { echo "FAIL: the bytes held or gathered are not the plan's"; exit 1; }
    ;;
  grpo)
    common=(grpo "$src/tests/data/grpo_cli/grpo.toml" --model.tokenizer="$src/inputs/quickstart"
            --data.input="$src/tests/data/sft/train.jsonl")
    same_training grpo_np1_bnb 1 "${common[@]}" "${bnb[@]}"
    same_training grpo_np2_at_load 2 "${common[@]}" "${at_load[@]}" --eval.input="$work/eval5.jsonl" \
                  --eval.every_steps=2
    same_training grpo_np2_bnb_plain 2 "${common[@]}" "${bnb_plain[@]}"
    same_training grpo_np4_random5 4 "${common[@]}" "${random5[@]}" --model.shard_base_keep=true
    ;;
  dpo)
    common=(dpo --runtime.backend=cpu --model.tokenizer="$src/inputs/quickstart"
            --data.input="$src/tests/data/dpo_cli/train.jsonl" --train.batch_size=8 --train.lr=2e-3 --lora.r=4
            --lora.alpha=8 --checkpoint.resume=none --train.max_steps=3)
    head -n 13 "$src/tests/data/dpo_cli/heldout.jsonl" > "$work/dpo_eval13.jsonl"
    same_training dpo_np1_at_load 1 "${common[@]}" "${at_load[@]}"
    same_training dpo_np2_bnb 2 "${common[@]}" "${bnb[@]}" --eval.input="$work/dpo_eval13.jsonl" --eval.batch_size=3 \
                  --eval.every_steps=2
    ;;
  generate)
    common=(generate --runtime.backend=cpu --lora.adapter="$nf4/llama_nf4" --model.tokenizer="$src/inputs/quickstart"
            --data.input="$src/tests/data/generate/prompts.jsonl" --generate.max_new_tokens=6
            --generate.num_generations=2 --generate.temperature=0.8 --generate.top_p=0.9 --generate.seed=7)
    for c in "1 bnb" "2 at_load" "2 bnb_plain" "4 bnb" "4 bnb_plain"; do
      set -- $c
      declare -n model=$2
      # the unsharded one-rank output of this model, once per model
      [ -f "$work/plain_$2.jsonl" ] ||
        run 1 "${common[@]}" "${model[@]}" --generate.output="$work/plain_$2.jsonl" > /dev/null
      run "$1" "${common[@]}" "${model[@]}" --model.shard_base=true --generate.max_sequences=2 \
        --generate.output="$work/shard_$1_$2.jsonl" > /dev/null
      cmp "$work/plain_$2.jsonl" "$work/shard_$1_$2.jsonl"
      [ "$(wc -l < "$work/plain_$2.jsonl")" = 10 ] || { echo "FAIL: not 10 completions"; exit 1; }
      unset -n model
      echo "generate $2: $1 ranks sharded equal one unsharded rank"
    done
    ;;
  score)
    common=(score --runtime.backend=cpu --lora.adapter="$nf4/llama_nf4" --data.input="$nf4/score.jsonl"
            --score.batch_size=2)
    for c in "1 bnb" "2 at_load" "4 bnb" "4 bnb_plain"; do
      set -- $c
      declare -n model=$2
      run "$1" "${common[@]}" "${model[@]}" --score.output="$work/plain_$1_$2.h5" > /dev/null
      run "$1" "${common[@]}" "${model[@]}" --model.shard_base=true --score.output="$work/shard_$1_$2.h5" > /dev/null
      h5diff "$work/plain_$1_$2.h5" "$work/shard_$1_$2.h5"
      unset -n model
      echo "score $2: $1 ranks sharded equal unsharded"
    done
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
echo "qlora shard_base $mode: all equal"
