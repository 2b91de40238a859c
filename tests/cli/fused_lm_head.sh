#!/usr/bin/env bash
# fused_lm_head.sh: SFT with the LM head's backward inside the forward (the default) against MGRL_FUSED_LM_HEAD=0 (the
# head's logits computed again in the backward): bit for bit the same trainable weights and AdamW moments, and the
# same logged losses and gradient norms, in each case below.
#   fused_lm_head.sh WORK CHECK_TRAIN -- LAUNCH...   LAUNCH: the mgrl sft command line (with mpiexec for several
#   ranks), without --train.max_steps, --checkpoint.dir or --log.dir, which this adds (3 steps).
# Cases:
#   lora_scaled   LoRA, train.grad_accum = 2, dynamic loss scaling (the backward's weights times the scale, the
#                 loss's not), model.recompute = true
#   full_tied     full fine-tuning of a model with tied embeddings (the head's gradient and the embedding's are one
#                 buffer, accumulated in the same order), train.grad_accum = 2, no loss scaling
# The runs with the switch off must say so on their first lines (the switch reached mgrl), the others must not.
set -euo pipefail
work=$1 check=$2
shift 2
[ "$1" = -- ] && shift
launch=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run NAME FUSED [extra mgrl args...]: into $work/NAME, output in $work/NAME.log
  local name=$1 fused=$2
  shift 2
  local env=()
  [ "$fused" = 0 ] && env=(env MGRL_FUSED_LM_HEAD=0)
  "${env[@]}" "${launch[@]}" --train.max_steps=3 --eval.input= --checkpoint.dir="$work/$name" --log.dir="$work/$name" "$@" \
    > "$work/$name.log" 2>&1 || fail "$name: exit $? ($(tail -n 3 "$work/$name.log"))"
  if [ "$fused" = 0 ]; then
    grep -q '^MGRL_FUSED_LM_HEAD=0: ' "$work/$name.log" || fail "$name: the switch did not reach mgrl"
  else
    ! grep -q 'MGRL_FUSED_LM_HEAD' "$work/$name.log" || fail "$name: the fused run reports the switch"
  fi
}
compare() {  # compare CASE [extra mgrl args...]
  local c=$1
  shift
  run "$c.fused" 1 "$@"
  run "$c.off" 0 "$@"
  "$check" weights "$work/$c.fused/step_00000003.h5" "$work/$c.off/step_00000003.h5" --exact |
    grep 'bitwise equal: yes' || fail "$c: the checkpoints differ"
  for key in loss grad_norm; do
    "$check" losses "$work/$c.fused/metrics.jsonl" "$work/$c.off/metrics.jsonl" --key=$key |
      grep ' 3 .* 0 differ' || fail "$c: the logged $key differs"
  done
}
compare lora_scaled --train.grad_accum=2 --train.loss_scaling=dynamic --model.recompute=true
compare full_tied --train.grad_accum=2 --train.full_finetune=true --train.lr=1e-4
echo "PASS: fused LM head = MGRL_FUSED_LM_HEAD=0, bit for bit"
