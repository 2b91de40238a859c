#!/usr/bin/env bash
# grpo_objectives.sh WORK CHECK -- MGRL ARGS...: each of trl's newer GRPO objectives and options reaches the run
# (the math itself: unit.grpo_loss against trl's fixtures): 2 steps of `mgrl grpo` (num_iterations 2, so the second
# step's ratios differ from 1) with grpo.delta, loss_type cispo / sapo / luspo / vespo, multi_objective_aggregation =
# normalize_then_sum and off_policy_mask_threshold each train other weights than the default objective, and log their clip metrics by trl's names
# (cispo_clip_ratio; vespo/phi_seq_mean; sapo none; the clipped losses clip_ratio/*).
set -uo pipefail
work=$1 check=$2
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
run() {  # NAME ARGS...
  local name=$1
  shift
  "$@" --train.max_steps=2 --checkpoint.dir="$work/$name" --log.dir="$work/$name" > "$work/$name.log" 2>&1 ||
    fail "$name: $(tail -n 3 "$work/$name.log")"
}
run default "$@"
run delta "$@" --grpo.delta=1.01
run cispo "$@" --grpo.loss_type=cispo --grpo.epsilon_high=1.05
run sapo "$@" --grpo.loss_type=sapo --grpo.sapo_temperature_neg=3
run luspo "$@" --grpo.loss_type=luspo
run gdpo "$@" --grpo.multi_objective_aggregation=normalize_then_sum
run opsm "$@" --grpo.off_policy_mask_threshold=0.001
run vespo "$@" --grpo.loss_type=vespo
for v in delta cispo sapo luspo gdpo opsm vespo; do
  "$check" weights "$work/default/step_00000002.h5" "$work/$v/step_00000002.h5" --rtol=1e-6 > /dev/null 2>&1 &&
    fail "$v trained the default objective's weights"
  echo "$v: other weights than the default"
done
last() { grep '"loss"' "$work/$1/metrics.jsonl" | tail -n 1; }
{ last cispo | grep -q '"cispo_clip_ratio"' && ! last cispo | grep -q 'clip_ratio/'; } || fail "cispo metrics: $(last cispo)"
! last sapo | grep -q 'clip_ratio' || fail "sapo metrics: $(last sapo)"
last delta | grep -q '"clip_ratio/region_mean"' || fail "delta metrics: $(last delta)"
{ last vespo | grep -q '"vespo/phi_seq_mean"' && ! last vespo | grep -q 'clip_ratio'; } || fail "vespo metrics: $(last vespo)"
echo "PASS: grpo objectives"
