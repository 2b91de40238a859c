#!/usr/bin/env bash
# fused_norm.sh: the decoder block's fused residual + RMSNorm ops (the default) against MGRL_FUSED_NORM=0 (copy,
# residual add and norm as separate ops): bit for bit the same on the CPU backend, for training and for generation.
#   fused_norm.sh WORK CHECK_TRAIN -- SFT_LAUNCH... -- GENERATE...
#   SFT_LAUNCH: the mgrl sft command line (with mpiexec for several ranks), without --train.max_steps,
#   --checkpoint.dir or --log.dir, which this adds (3 steps, LoRA, model.recompute = true: the backward recomputes each
#   layer's forward through the same block). GENERATE: an mgrl generate command line without --generate.output,
#   which this adds (greedy).
# Asserts: the same trainable weights and AdamW moments (bitwise), the same logged losses and gradient norms, and the
# same generated lines (tokens, text, log-probs); the runs with the switch off say so on their output (the switch
# reached mgrl), the others do not.
set -euo pipefail
work=$1 check=$2
shift 2
[ "$1" = -- ] && shift
sft=() gen=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do sft+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
gen=("$@")
[ ${#sft[@]} -gt 0 ] && [ ${#gen[@]} -gt 0 ] || { echo "usage: fused_norm.sh WORK CHECK -- SFT... -- GENERATE..."; exit 2; }
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
switch_seen() {  # switch_seen NAME FUSED: the off run logged the switch, the fused one did not
  if [ "$2" = 0 ]; then
    grep -q '^MGRL_FUSED_NORM=0: ' "$work/$1.log" || fail "$1: the switch did not reach mgrl"
  else
    ! grep -q 'MGRL_FUSED_NORM' "$work/$1.log" || fail "$1: the fused run reports the switch"
  fi
}
for fused in 1 0; do
  env=(env)
  [ "$fused" = 0 ] && env=(env MGRL_FUSED_NORM=0)
  name=sft.$fused
  "${env[@]}" "${sft[@]}" --train.max_steps=3 --eval.input= --model.recompute=true --checkpoint.dir="$work/$name" \
    --log.dir="$work/$name" > "$work/$name.log" 2>&1 || fail "$name: exit $? ($(tail -n 3 "$work/$name.log"))"
  switch_seen "$name" "$fused"
  name=gen.$fused
  "${env[@]}" "${gen[@]}" --generate.temperature=0 --generate.output="$work/$name.jsonl" > "$work/$name.log" 2>&1 ||
    fail "$name: exit $? ($(tail -n 3 "$work/$name.log"))"
  switch_seen "$name" "$fused"
done
"$check" weights "$work/sft.1/step_00000003.h5" "$work/sft.0/step_00000003.h5" --exact | grep 'bitwise equal: yes' ||
  fail "sft: the checkpoints differ"
for key in loss grad_norm; do
  "$check" losses "$work/sft.1/metrics.jsonl" "$work/sft.0/metrics.jsonl" --key=$key | grep ' 3 .* 0 differ' ||
    fail "sft: the logged $key differs"
done
[ -s "$work/gen.1.jsonl" ] || fail "generate: no output"
cmp "$work/gen.1.jsonl" "$work/gen.0.jsonl" || fail "generate: the greedy completions differ"
echo "PASS: fused residual + RMSNorm = MGRL_FUSED_NORM=0, bit for bit (SFT at 2 ranks with recompute, greedy generation)"
