#!/usr/bin/env bash
# neftune.sh WORK MGRL CHECK MODELS DATA TOKENIZER GRPO_TOML MPIEXEC NUMPROC_FLAG [MPI FLAGS...]:
# train.neftune_noise_alpha (NEFTune, trl's SFT option) end to end:
# - it acts on training (alpha 5 trains other weights than 0), the same on 1 rank and on 2 ranks with grad_accum 2;
# - at learning rate 0 the training losses differ from a run without it but the held-out losses do not (evaluation
#   sees no noise);
# - another mode refuses it (exit 2, one line).
set -uo pipefail
work=$1 mgrl=$2 check=$3 models=$4 data=$5 tok=$6 grpo=$7
shift 7
mpirun=("$@")
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
sft=(sft --runtime.backend=cpu --model.path="$models/qwen2_bias_tied" --model.tokenizer="$tok" --checkpoint.resume=none
  --data.input="$data/sft/train.jsonl" --train.batch_size=8 --train.lr=1e-2 --lora.r=4 --lora.alpha=8 --train.max_steps=4)
run() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  on_ranks "$ranks" "$@" --checkpoint.dir="$work/$name" --log.dir="$work/$name" > "$work/$name.log" 2>&1 ||
    fail "$name: $(tail -n 2 "$work/$name.log")"
}
run plain 1 "$mgrl" "${sft[@]}"
run nef 1 "$mgrl" "${sft[@]}" --train.neftune_noise_alpha=5
run nef2 2 "$mgrl" "${sft[@]}" --train.neftune_noise_alpha=5 --train.grad_accum=2
"$check" weights "$work/plain/step_00000004.h5" "$work/nef/step_00000004.h5" --rtol=1e-4 > /dev/null &&
  fail "alpha 5 trained the weights of alpha 0"
"$check" weights "$work/nef/step_00000004.h5" "$work/nef2/step_00000004.h5" --rtol=1e-5 || fail "2 ranks differ"
lr0=(--train.lr=0 --eval.input="$data/sft/heldout.jsonl" --eval.every_steps=2)
run plain0 1 "$mgrl" "${sft[@]}" "${lr0[@]}"
run nef0 1 "$mgrl" "${sft[@]}" "${lr0[@]}" --train.neftune_noise_alpha=5
"$check" losses "$work/plain0/metrics.jsonl" "$work/nef0/metrics.jsonl" --after=0 --key=eval_loss || fail "evaluation saw noise"
"$check" losses "$work/plain0/metrics.jsonl" "$work/nef0/metrics.jsonl" --after=0 > /dev/null && fail "training saw no noise"
echo "the noise acts on training only"
out=$("$mgrl" "$grpo" --model.path="$models/qwen2_bias_tied" --model.tokenizer="$tok" --data.input="$data/sft/train.jsonl" \
  --checkpoint.dir= --train.neftune_noise_alpha=5 2>&1)
[ $? = 2 ] && [ "$(echo "$out" | grep -c '^mgrl: error: ')" = 1 ] &&
  echo "$out" | grep -q "key 'train.neftune_noise_alpha' adds NEFTune's noise to SFT's training embeddings; mgrl grpo does not use it" ||
  fail "grpo: $out"
echo "PASS: neftune"
